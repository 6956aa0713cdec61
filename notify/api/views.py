"""Notification channels: operator roles read, operator admins write; customers never see
them (an empty list, 404 for any channel). Create (and rotate-secret) return a webhook channel's secret once."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from notify import selectors, services, tasks
from notify.api.serializers import (
    ChannelSerializer,
    ChannelUpdateSerializer,
    ChannelWriteSerializer,
    DeliverySerializer,
)
from notify.models import NotificationChannel
from tenants.api.base import TenantScopedViewSet
from tenants.api.permissions import AdminScopeForWrites


class NotificationChannelViewSet(TenantScopedViewSet):
    model = NotificationChannel
    route = "notification-channels"
    serializer_class = ChannelSerializer

    def scope_queryset(self, queryset: Any) -> Any:
        return queryset.prefetch_related("rules")

    # Any principal passes the permission, so a customer's request reaches the scoped
    # queryset (operator-only: empty for customers) and gets 404 for any channel, as another
    # operator's would; writes are refused by the services (403) to all but operator admins,
    # and here to tokens without the admin scope.
    permission_classes = [AdminScopeForWrites]

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        made = services.do_create_channel(self.principal, **self.validated(ChannelWriteSerializer))
        extra = {"secret": made.secret} if made.secret else {}
        return self.created(made.channel, **extra)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        channel = self.get_object()
        changes = self.validated(ChannelUpdateSerializer)
        channel = services.do_update_channel(self.principal, channel, **changes)
        return Response(ChannelSerializer(channel).data)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.do_delete_channel(self.principal, self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @action(detail=True, methods=["post"])
    def test(self, request: Request, pk: str | None = None) -> Response:
        row = services.do_send_test(self.principal, self.get_object())
        transaction.on_commit(tasks.deliver_due.delay, robust=True)
        return Response(DeliverySerializer(row).data, status=status.HTTP_202_ACCEPTED)

    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request: Request, pk: str | None = None) -> Response:
        secret = services.do_rotate_secret(self.principal, self.get_object())
        return Response({"secret": secret, "previous_valid_for_s": services.ROTATION_OVERLAP_S})

    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, pk: str | None = None) -> Response:
        rows = selectors.deliveries_of(self.principal, self.get_object())
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(DeliverySerializer(page, many=True).data)
