"""Tenancy endpoints: customers, API tokens, agent tokens, job-to-customer mapping rules.

Thin views: validate the shape, call one service with the request's principal, serialize.
Who may do what is decided by the permission classes and, again, by the services.
"""

from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
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
    AgentTokenCreatedSerializer,
    AgentTokenCreateSerializer,
    AgentTokenSerializer,
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    CustomerCreateSerializer,
    CustomerSerializer,
    JobMappingRuleSerializer,
    JobMappingRuleWriteSerializer,
)
from tenants.models import AgentToken, ApiToken, Customer, HashedToken, JobMappingRule

# --- OpenAPI examples (docs/api.md) ------------------------------------------------------------
_AT = "2026-12-02T08:10:00Z"
CUSTOMER = OpenApiExample(
    "customer",
    value={"id": 7, "name": "Acme ML", "slug": "acme-ml", "created_at": _AT},
    response_only=True,
)
CUSTOMER_NEW = OpenApiExample(
    "new customer", value={"name": "Acme ML", "slug": "acme-ml"}, request_only=True
)
_API_TOKEN = {
    "id": 12,
    "name": "zendesk",
    "prefix": "prf_Xk3v9QaB",
    "customer": None,
    "role": "operator_support",
    "scope": "read_write",
    "created_at": _AT,
    "expires_at": None,
    "revoked_at": None,
    "last_used_at": None,
    "rate_limit": "",
}
API_TOKEN = OpenApiExample("API token", value=_API_TOKEN, response_only=True)
API_TOKEN_NEW = OpenApiExample(
    "a ticket system's token",
    value={"name": "zendesk", "scope": "write", "rate_limit": "120/min"},
    request_only=True,
)
API_TOKEN_CREATED = OpenApiExample(
    "created (the secret, once)",
    value={**_API_TOKEN, "rate_limit": "120/min", "token": "prf_Xk3v9QaB..."},
    response_only=True,
)
API_TOKEN_REVOKED = OpenApiExample(
    "revoked", value={**_API_TOKEN, "revoked_at": _AT}, response_only=True
)
_AGENT_TOKEN = {
    "id": 3,
    "name": "rack 12",
    "prefix": "prfa_9fQe2LmZ",
    "created_at": _AT,
    "revoked_at": None,
    "last_used_at": _AT,
}
AGENT_TOKEN = OpenApiExample("agent token", value=_AGENT_TOKEN, response_only=True)
AGENT_TOKEN_NEW = OpenApiExample("new agent token", value={"name": "rack 12"}, request_only=True)
AGENT_TOKEN_CREATED = OpenApiExample(
    "created (the secret, once)",
    value={**_AGENT_TOKEN, "last_used_at": None, "token": "prfa_9fQe2LmZ..."},
    response_only=True,
)
AGENT_TOKEN_REVOKED = OpenApiExample(
    "revoked", value={**_AGENT_TOKEN, "revoked_at": _AT}, response_only=True
)
_RULE = {"match_field": "slurm_account", "value": "acme", "customer": 7, "priority": 100}
RULE = OpenApiExample("rule", value={"id": 4, **_RULE, "created_at": _AT}, response_only=True)
RULE_NEW = OpenApiExample("Slurm account to customer", value=_RULE, request_only=True)
RULE_CHANGE = OpenApiExample("a new priority", value={"priority": 10}, request_only=True)


@extend_schema_view(
    list=extend_schema(
        summary="List customers",
        description="Operator roles: every customer of theirs; customer roles: their own.",
        examples=[CUSTOMER],
    ),
    retrieve=extend_schema(summary="One customer", examples=[CUSTOMER]),
    create=extend_schema(
        summary="Create a customer (operator roles with write access)",
        request=CustomerCreateSerializer,
        responses={201: CustomerSerializer},
        examples=[CUSTOMER_NEW, CUSTOMER],
    ),
)
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


@extend_schema_view(
    list=extend_schema(
        summary="List API tokens",
        description="Operator roles: the operator's tokens; customer roles: their customer's.",
        examples=[API_TOKEN],
    ),
    retrieve=extend_schema(summary="One API token", examples=[API_TOKEN]),
    create=extend_schema(
        summary="Create an API token (admin rights)",
        description="The plaintext `token` is in this response only; Proof keeps its hash. "
        "`scope`: read, write or admin; `rate_limit`: its own request rate.",
        request=ApiTokenCreateSerializer,
        responses={201: ApiTokenCreatedSerializer},
        examples=[API_TOKEN_NEW, API_TOKEN_CREATED],
    ),
    revoke=extend_schema(
        summary="Revoke an API token (at once)",
        request=None,
        responses={200: ApiTokenSerializer},
        examples=[API_TOKEN_REVOKED],
    ),
)
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


@extend_schema_view(
    list=extend_schema(summary="List agent tokens (operator admins)", examples=[AGENT_TOKEN]),
    retrieve=extend_schema(summary="One agent token", examples=[AGENT_TOKEN]),
    create=extend_schema(
        summary="Create an agent token (operator admins, admin rights)",
        description="Node agents stream telemetry with it; the plaintext is in this response only.",
        request=AgentTokenCreateSerializer,
        responses={201: AgentTokenCreatedSerializer},
        examples=[AGENT_TOKEN_NEW, AGENT_TOKEN_CREATED],
    ),
    revoke=extend_schema(
        summary="Revoke an agent token",
        request=None,
        responses={200: AgentTokenSerializer},
        examples=[AGENT_TOKEN_REVOKED],
    ),
)
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


@extend_schema_view(
    list=extend_schema(
        summary="List job-to-customer mapping rules (operator admins)",
        description="The lowest priority that matches a job names its customer.",
        examples=[RULE],
    ),
    retrieve=extend_schema(summary="One mapping rule", examples=[RULE]),
    create=extend_schema(
        summary="Create a mapping rule",
        request=JobMappingRuleWriteSerializer,
        responses={201: JobMappingRuleSerializer},
        examples=[RULE_NEW, RULE],
    ),
    update=extend_schema(
        summary="Replace a mapping rule",
        request=JobMappingRuleWriteSerializer,
        responses={200: JobMappingRuleSerializer},
        examples=[RULE_NEW, RULE],
    ),
    partial_update=extend_schema(
        summary="Change a mapping rule",
        request=JobMappingRuleWriteSerializer,
        responses={200: JobMappingRuleSerializer},
        examples=[RULE_CHANGE, RULE],
    ),
    destroy=extend_schema(summary="Delete a mapping rule"),
)
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
