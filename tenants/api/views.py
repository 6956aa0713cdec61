"""Tenancy endpoints: customers, API tokens, agent tokens, job-to-customer mapping rules.

Thin views: validate the shape, call one service with the request's principal, serialize.
Who may do what is decided by the permission classes and, again, by the services.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rest_framework import status
from rest_framework.decorators import action
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer

from tenants import services
from tenants.api.base import TenantScopedViewSet
from tenants.api.permissions import (
    AdminScopeForWrites,
    HasPrincipal,
    IsOperatorAdminPrincipal,
    IsOperatorPrincipal,
)
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
from tenants.models import AgentToken, ApiToken, Customer, HashedToken, JobMappingRule


class CustomerViewSet(TenantScopedViewSet):
    """Operator roles see and create their customers; customer roles see only their own."""

    model = Customer
    route = "customers"
    serializer_class = CustomerSerializer
    http_method_names = ["get", "post", "head", "options"]

    def get_permissions(self) -> list[BasePermission]:
        if self.action == "create":
            return [IsOperatorPrincipal()]
        return [HasPrincipal()]

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.create_with(services.do_create_customer, CustomerCreateSerializer)


class _TokenViewSet(TenantScopedViewSet):
    """Tokens: create (the plaintext is in this one response only), list, revoke."""

    http_method_names = ["get", "post", "head", "options"]
    create_shape: ClassVar[type[Serializer[Any]]]

    def issue(self, data: dict[str, Any]) -> tuple[HashedToken, str]:
        raise NotImplementedError

    def revoke_token(self, pk: int) -> HashedToken:
        raise NotImplementedError

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        token, plaintext = self.issue(self.validated(self.create_shape))
        return self.created(token, token=plaintext)

    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        token = self.revoke_token(int(self.get_object().pk))
        return Response(self.get_serializer_class()(token).data)


class ApiTokenViewSet(_TokenViewSet):
    """API tokens. Customer principals see and manage their own customer's tokens only."""

    model = ApiToken
    route = "api-tokens"
    serializer_class = ApiTokenSerializer
    create_shape = ApiTokenCreateSerializer
    # Making and revoking tokens is an admin endpoint: a token needs the admin scope.
    permission_classes = [AdminScopeForWrites]

    def issue(self, data: dict[str, Any]) -> tuple[HashedToken, str]:
        return services.do_create_api_token(self.principal, **data)

    def revoke_token(self, pk: int) -> HashedToken:
        return services.do_revoke_api_token(self.principal, pk)


class AgentTokenViewSet(_TokenViewSet):
    """Agent tokens for node agents: operator admins only."""

    model = AgentToken
    route = "agent-tokens"
    serializer_class = AgentTokenSerializer
    create_shape = AgentTokenCreateSerializer
    permission_classes = [IsOperatorAdminPrincipal]

    def issue(self, data: dict[str, Any]) -> tuple[HashedToken, str]:
        return services.do_create_agent_token(self.principal, name=data["name"])

    def revoke_token(self, pk: int) -> HashedToken:
        return services.do_revoke_agent_token(self.principal, pk)


class JobMappingRuleViewSet(TenantScopedViewSet):
    """Job-to-customer mapping rules: operator admins only."""

    model = JobMappingRule
    route = "job-mapping-rules"
    serializer_class = JobMappingRuleSerializer
    permission_classes = [IsOperatorAdminPrincipal]

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.create_with(services.do_create_mapping_rule, JobMappingRuleWriteSerializer)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        partial = bool(kwargs.get("partial", False))
        rule = self.get_object()
        changes = self.validated(JobMappingRuleWriteSerializer, partial=partial)
        rule = services.do_update_mapping_rule(self.principal, int(rule.pk), **changes)
        return Response(JobMappingRuleSerializer(rule).data)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.do_delete_mapping_rule(self.principal, int(self.get_object().pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
