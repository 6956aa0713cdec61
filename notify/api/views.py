"""Notification channels: operator roles read, operator admins write; customers never see
them (an empty list, 404 for any channel). Create (and rotate-secret) return a webhook channel's secret once."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from notify import selectors, services, tasks
from notify.api.serializers import (
    ChannelCreatedSerializer,
    ChannelSerializer,
    ChannelUpdateSerializer,
    ChannelWriteSerializer,
    DeliverySerializer,
    RotatedSecretSerializer,
)
from notify.models import NotificationChannel
from tenants.api.base import TenantScopedViewSet
from tenants.api.permissions import AdminScopeForWrites

_AT = "2026-12-02T08:10:00Z"
_RULE = {
    "families": ["xid_error", "ecc_errors"],
    "categories": ["infrastructure"],
    "customer": None,
    "min_gpu_hours_lost": 1.0,
    "min_money_lost": None,
}
_CHANNEL = {
    "id": 5,
    "name": "Zendesk bridge",
    "kind": "webhook",
    "target": "…/hook",
    "addresses": [],
    "enabled": True,
    "disabled_reason": "",
    "rules": [_RULE],
    "created_at": _AT,
    "updated_at": _AT,
}
CHANNEL = OpenApiExample("webhook channel", value=_CHANNEL, response_only=True)
CHANNEL_NEW = OpenApiExample(
    "a webhook to a ticket bridge",
    value={
        "name": "Zendesk bridge",
        "kind": "webhook",
        "target": "https://tickets.example.com/proof/hook",
        "rules": [{"families": ["xid_error"], "categories": ["infrastructure"]}],
    },
    request_only=True,
)
CHANNEL_CREATED = OpenApiExample(
    "created (the secret, once)",
    value={**_CHANNEL, "secret": "whsec_MfKQ9r8GZmZ1..."},
    response_only=True,
)
CHANNEL_CHANGE = OpenApiExample("pause it", value={"enabled": False}, request_only=True)
DELIVERY = OpenApiExample(
    "delivery",
    value={
        "id": 41,
        "kind": "test",
        "incident": None,
        "event_id": "evt_2b1f0c8e",
        "state": "pending",
        "attempts": 0,
        "next_attempt_at": _AT,
        "last_status": None,
        "last_error": "",
        "created_at": _AT,
        "sent_at": None,
    },
    response_only=True,
)
DELIVERY_QUEUED = OpenApiExample(
    "queued", value=DELIVERY.value, response_only=True, status_codes=["202"]
)
ROTATED = OpenApiExample(
    "rotated",
    value={"secret": "whsec_Q2x7...", "previous_valid_for_s": services.ROTATION_OVERLAP_S},
    response_only=True,
)


@extend_schema_view(
    list=extend_schema(
        summary="List notification channels (operator roles)",
        description="Customers get an empty list. `target` shows its last 4 characters only.",
        examples=[CHANNEL],
    ),
    retrieve=extend_schema(summary="One channel", examples=[CHANNEL]),
    create=extend_schema(
        summary="Create a channel (operator admins, admin rights)",
        request=ChannelWriteSerializer,
        responses={201: ChannelCreatedSerializer},
        examples=[CHANNEL_NEW, CHANNEL_CREATED],
    ),
    update=extend_schema(
        summary="Change a channel (rules replaced as a whole)",
        request=ChannelUpdateSerializer,
        responses={200: ChannelSerializer},
        examples=[CHANNEL_CHANGE, CHANNEL],
    ),
    partial_update=extend_schema(
        summary="Change a channel (rules replaced as a whole)",
        request=ChannelUpdateSerializer,
        responses={200: ChannelSerializer},
        examples=[CHANNEL_CHANGE, CHANNEL],
    ),
    destroy=extend_schema(summary="Delete a channel"),
    test=extend_schema(
        summary="Queue a test event through the outbox",
        request=None,
        responses={202: DeliverySerializer},
        examples=[DELIVERY_QUEUED],
    ),
    rotate_secret=extend_schema(
        summary="Rotate a webhook channel's signing secret",
        request=None,
        responses={200: RotatedSecretSerializer},
        examples=[ROTATED],
    ),
    deliveries=extend_schema(
        summary="The channel's delivery log, newest first",
        responses={200: DeliverySerializer(many=True)},
        examples=[DELIVERY],
    ),
)
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
