"""Tenancy: operators (the paying tenants), their customers, users' memberships.

Every tenant-owned model subclasses `TenantOwned`: it carries `operator` and gets the scoped
manager whose `for_tenant(principal)` is the one permission filter of the project. On
PostgreSQL each such table also has row-level security enabled and forced (tenants/rls.py).
"""

from __future__ import annotations

from typing import ClassVar, Self, TypeVar

from django.conf import settings
from django.db import models

from tenants.access import Principal

# Re-exported (`X as X`): callers import the roles with the models they describe.
from tenants.roles import CUSTOMER_ROLES as CUSTOMER_ROLES
from tenants.roles import OPERATOR_ROLES as OPERATOR_ROLES
from tenants.roles import Role as Role


class Operator(models.Model):
    """A GPU cloud or data centre: the paying tenant. Its id is the RLS tenant key."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The customer-facing verdict pages and share links show stable aliases ("node-1") instead
    # of the operator's hostnames and GPU UUIDs (docs/notifications.md).
    mask_node_names = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


_M = TypeVar("_M", bound=models.Model)


class TenantQuerySet(models.QuerySet[_M]):
    def for_tenant(self, principal: Principal | Operator | int) -> Self:
        """Rows the principal may see: the operator's, narrowed to one customer's for
        customer principals (via the model's `customer_path`; none if it has none)."""
        if isinstance(principal, Principal):
            qs = self.filter(operator_id=principal.operator_id)
            if principal.customer_id is None:
                return qs
            path = getattr(self.model, "customer_path", None)
            if path is None:
                return qs.none()
            lookup = "pk" if path in ("id", "pk") else f"{path}_id"
            return qs.filter(**{lookup: principal.customer_id})
        operator_id = principal.pk if isinstance(principal, Operator) else int(principal)
        return self.filter(operator_id=operator_id)


class TenantManager(models.Manager[_M]):
    """The manager of every tenant-owned model: its querysets have `for_tenant`."""

    def get_queryset(self) -> TenantQuerySet[_M]:
        return TenantQuerySet(self.model, using=self._db)

    def for_tenant(self, principal: Principal | Operator | int) -> TenantQuerySet[_M]:
        return self.get_queryset().for_tenant(principal)


class TenantOwned(models.Model):
    """Base of every tenant-owned model.

    `customer_path` names the lookup from this model to its Customer (e.g. "customer" or
    "job__customer"); models without one are operator-only and invisible to customer roles.
    """

    operator = models.ForeignKey(Operator, on_delete=models.CASCADE, related_name="+")

    customer_path: ClassVar[str | None] = None

    objects = TenantManager()

    class Meta:
        abstract = True


def unique_per_operator(
    *fields: str, name: str, condition: models.Q | None = None
) -> models.UniqueConstraint:
    """A uniqueness within one operator's rows: the tenant key leads the constraint."""
    return models.UniqueConstraint(fields=["operator", *fields], condition=condition, name=name)


def operator_index(*fields: str, name: str) -> models.Index:
    """An index for one operator's queries (every tenant query filters on the operator)."""
    return models.Index(fields=["operator", *fields], name=name)


class Customer(TenantOwned):
    """An operator's client (an ML team). Belongs to exactly one operator."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    customer_path: ClassVar[str | None] = "id"

    class Meta:
        ordering = ["name"]
        constraints = [unique_per_operator("slug", name="customer_slug_per_operator")]

    def __str__(self) -> str:
        return self.name


def _role_matches_scope(name: str) -> models.CheckConstraint:
    """Operator roles hold no customer; customer roles always name one."""
    return models.CheckConstraint(
        condition=(
            models.Q(role__in=[Role.OPERATOR_ADMIN, Role.OPERATOR_SUPPORT], customer__isnull=True)
            | models.Q(role__in=[Role.CUSTOMER_ADMIN, Role.CUSTOMER_VIEWER], customer__isnull=False)
        ),
        name=name,
    )


class Membership(TenantOwned):
    """A user's role at one operator, or at one of its customers (customer roles only)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership"
    )
    customer = models.ForeignKey(
        Customer, on_delete=models.CASCADE, null=True, blank=True, related_name="memberships"
    )
    role = models.CharField(max_length=32, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    customer_path: ClassVar[str | None] = "customer"

    class Meta:
        constraints = [_role_matches_scope("membership_role_matches_scope")]

    def __str__(self) -> str:
        return f"{self.user} as {self.role}"


class TokenScope(models.TextChoices):
    """What a token may do, on top of what its role may: `read`; `read_write` (the API's
    "write"); `admin` (write, and the admin endpoints: tokens, agent tokens, mapping rules,
    channels, prices — only for an admin role)."""

    READ = "read", "Read only"
    READ_WRITE = "read_write", "Read and write"
    ADMIN = "admin", "Read, write and admin"


# Accepted on input for a scope's stored name (docs/api.md: scopes read, write, admin).
TOKEN_SCOPE_ALIASES = {"write": TokenScope.READ_WRITE}


class HashedToken(TenantOwned):
    """A named secret stored as its SHA-256 only: the plaintext is shown once at creation and
    `prefix` (its first characters) identifies it afterwards; revocable."""

    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=32)
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class ApiToken(HashedToken):
    """A REST API credential, scoped to the operator or to one of its customers.

    `role` is the role the token acts with — never above the role of whoever created it (tenants/services.py).
    """

    customer = models.ForeignKey(
        Customer, on_delete=models.CASCADE, null=True, blank=True, related_name="api_tokens"
    )
    role = models.CharField(max_length=32, choices=Role.choices)
    scope = models.CharField(max_length=16, choices=TokenScope.choices)
    expires_at = models.DateTimeField(null=True, blank=True)
    # Requests allowed to this token ("120/min", "10/s"); empty: PROOF_API_RATE
    # (tenants/api/throttling.py).
    rate_limit = models.CharField(max_length=32, blank=True, default="")

    customer_path: ClassVar[str | None] = "customer"

    class Meta(HashedToken.Meta):
        constraints = [_role_matches_scope("api_token_role_matches_scope")]


class AgentToken(HashedToken):
    """The credential node agents stream telemetry with; it alone names the tenant of the data.

    Operator-only: it carries no customer.
    """


class MatchField(models.TextChoices):
    SLURM_ACCOUNT = "slurm_account", "Slurm account"
    SLURM_PARTITION = "slurm_partition", "Slurm partition"
    SLURM_USER = "slurm_user", "Slurm user"
    K8S_NAMESPACE = "k8s_namespace", "Kubernetes namespace"
    JOB_ID_PREFIX = "job_id_prefix", "Job id prefix"


class JobMappingRule(TenantOwned):
    """Operator-set rule assigning jobs to a customer; the lowest `priority` that matches wins
    (ties: the older rule). Applied by ingest through services.customer_for_job()."""

    match_field = models.CharField(max_length=32, choices=MatchField.choices)
    value = models.CharField(max_length=255)
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="+")
    priority = models.IntegerField(default=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["priority", "id"]
        constraints = [
            unique_per_operator("match_field", "value", name="job_mapping_rule_unique_match")
        ]

    def __str__(self) -> str:
        return f"{self.match_field}={self.value} → {self.customer_id}"


class AuditEvent(TenantOwned):
    """One change someone made to the operator's account or its incidents (tenants/audit.py):
    who (`actor`: a username, `api-token:<prefix>` or `system`), what (`action`, e.g.
    "incident.resolve", "api_token.create"), to what (`target_type`, `target_id`: a public id
    or a row id, as text), when, and what it carried (`detail`). Written in the same transaction
    as the change, so a change that rolls back leaves no entry. Operator-only: customers'
    principals see none (no `customer_path`); `customer` names the customer it concerned."""

    customer = models.ForeignKey(
        Customer, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    actor = models.CharField(max_length=200)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=200, blank=True, default="")
    at = models.DateTimeField(auto_now_add=True)
    detail = models.JSONField(default=dict)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            # The audit log reads newest first, by action or actor, over a time range.
            operator_index("-at", "-id", name="tenants_audit_at"),
            operator_index("action", "-at", name="tenants_audit_action"),
            operator_index("actor", "-at", name="tenants_audit_actor"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target_type}"
