"""Tenancy endpoints: customers, API tokens, agent tokens, job-to-customer mapping rules.

Thin views: validate the shape, call one service with the request's principal, serialize.
Who may do what is decided by the permission classes and, again, by the services.
"""

from __future__ import annotations

from typing import Any

from rest_framework import status
from rest_framework.decorators import action
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from tenants import services
from tenants.api.base import TenantScopedViewSet
from tenants.api.permissions import HasPrincipal, IsOperatorAdminPrincipal, IsOperatorPrincipal
from tenants.api.serializers import (
    AgentTokenCreateSerializer,
    AgentTokenSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    CustomerCreateSerializer,
    CustomerSerializer,
    JobMappingRuleSerializer,
    JobMappingRuleWriteSerializer,
)
from tenants.models import AgentToken, ApiToken, Customer, JobMappingRule


class CustomerViewSet(TenantScopedViewSet):
    """Operator roles see and create their customers; customer roles see only their own."""

    model = Customer
    serializer_class = CustomerSerializer
    http_method_names = ["get", "post", "head", "options"]

    def get_permissions(self) -> list[BasePermission]:
        if self.action == "create":
            return [IsOperatorPrincipal()]
        return [HasPrincipal()]

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        shape = CustomerCreateSerializer(data=request.data)
        shape.is_valid(raise_exception=True)
        customer = services.do_create_customer(self.principal, **shape.validated_data)
        return Response(CustomerSerializer(customer).data, status=status.HTTP_201_CREATED)


class ApiTokenViewSet(TenantScopedViewSet):
    """API tokens: create (the plaintext is in this one response only), list, revoke.

    Customer principals see and manage their own customer's tokens only.
    """

    model = ApiToken
    serializer_class = ApiTokenSerializer
    permission_classes = [HasPrincipal]
    http_method_names = ["get", "post", "head", "options"]

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        shape = ApiTokenCreateSerializer(data=request.data)
        shape.is_valid(raise_exception=True)
        data = shape.validated_data
        token, plaintext = services.do_create_api_token(
            self.principal,
            name=data["name"],
            scope=data["scope"],
            customer_id=data["customer"],
            expires_at=data["expires_at"],
        )
        body = {**ApiTokenSerializer(token).data, "token": plaintext}
        return Response(body, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        token = services.do_revoke_api_token(self.principal, int(self.get_object().pk))
        return Response(ApiTokenSerializer(token).data)


class AgentTokenViewSet(TenantScopedViewSet):
    """Agent tokens for node agents: operator admins only."""

    model = AgentToken
    serializer_class = AgentTokenSerializer
    permission_classes = [IsOperatorAdminPrincipal]
    http_method_names = ["get", "post", "head", "options"]

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        shape = AgentTokenCreateSerializer(data=request.data)
        shape.is_valid(raise_exception=True)
        token, plaintext = services.do_create_agent_token(
            self.principal, name=shape.validated_data["name"]
        )
        body = {**AgentTokenSerializer(token).data, "token": plaintext}
        return Response(body, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        token = services.do_revoke_agent_token(self.principal, int(self.get_object().pk))
        return Response(AgentTokenSerializer(token).data)


class JobMappingRuleViewSet(TenantScopedViewSet):
    """Job-to-customer mapping rules: operator admins only."""

    model = JobMappingRule
    serializer_class = JobMappingRuleSerializer
    permission_classes = [IsOperatorAdminPrincipal]

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        shape = JobMappingRuleWriteSerializer(data=request.data)
        shape.is_valid(raise_exception=True)
        data = shape.validated_data
        rule = services.do_create_mapping_rule(
            self.principal,
            match_field=data["match_field"],
            value=data["value"],
            customer_id=data["customer"],
            priority=data["priority"],
        )
        return Response(JobMappingRuleSerializer(rule).data, status=status.HTTP_201_CREATED)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        partial = bool(kwargs.get("partial", False))
        rule = self.get_object()
        shape = JobMappingRuleWriteSerializer(data=request.data, partial=partial)
        shape.is_valid(raise_exception=True)
        changes = dict(shape.validated_data)
        if "customer" in changes:
            changes["customer_id"] = changes.pop("customer")
        rule = services.do_update_mapping_rule(self.principal, int(rule.pk), **changes)
        return Response(JobMappingRuleSerializer(rule).data)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.do_delete_mapping_rule(self.principal, int(self.get_object().pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
