"""Writes of tenancy data, and the token checks ingest and the API rely on.

Every function here owns its transaction and its tenant context, so it behaves the same from
a view, a Celery task, a management command or a shell. Functions acting for someone take
their `Principal` and enforce what that principal may do; callers (views, commands) only
validate shapes and translate the errors: `TenancyError` is bad input (HTTP 400),
`NotAllowed` a refusal (HTTP 403).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import ValidationError
from django.core.validators import validate_email, validate_slug
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from tenants.access import Principal, get_object_for_tenant, role_can_write
from tenants.audit import record_audit
from tenants.context import system_context, tenant_context
from tenants.models import (
    CUSTOMER_ROLES,
    OPERATOR_ROLES,
    TOKEN_SCOPE_ALIASES,
    AgentToken,
    ApiToken,
    Customer,
    JobMappingRule,
    MatchField,
    Membership,
    Operator,
    Role,
    TokenScope,
)
from tenants.tokens import AGENT_TOKEN_KIND, API_TOKEN_KIND, hash_secret, new_secret

# last_used_at is bookkeeping, not an audit log: one write a minute per token is plenty.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TenancyError(ValueError):
    """Bad input to a tenancy service; the message says what was wrong."""


class NotAllowed(TenancyError):
    """The principal may not do this."""


# --- operators, customers, members ------------------------------------------------------------


def _validate(validator: Any, value: str, what: str) -> None:
    try:
        validator(value)
    except ValidationError as exc:
        raise TenancyError(f"{what} {value!r} is not valid: {' '.join(exc.messages)}") from None


def _clean_name(value: str, what: str) -> str:
    value = (value or "").strip()
    if not value:
        raise TenancyError(f"{what} must not be empty")
    if len(value) > 200:
        raise TenancyError(f"{what} is longer than 200 characters")
    return value


def _create_user(username: str, email: str, password: str | None) -> User:
    """A new user; `password=None` makes one with no usable password (an invited member, who
    sets their own through a one-time link)."""
    user_model = get_user_model()
    username = (username or "").strip()
    if not username:
        raise TenancyError("the username must not be empty")
    _validate(user_model.username_validator, username, "username")
    if email:
        _validate(validate_email, email, "email address")
    if password is not None and not password:
        raise TenancyError("a password is required")
    if user_model.objects.filter(username=username).exists():
        raise TenancyError(f"a user named {username!r} already exists")
    return user_model.objects.create_user(username=username, email=email, password=password)


def do_create_operator(
    *, name: str, slug: str, admin_username: str, admin_email: str, admin_password: str
) -> tuple[Operator, User]:
    """A new operator and its first operator admin."""
    name = _clean_name(name, "the operator name")
    _validate(validate_slug, slug, "slug")
    with system_context():
        if Operator.objects.filter(slug=slug).exists():
            raise TenancyError(f"an operator with slug {slug!r} already exists")
        operator = Operator.objects.create(name=name, slug=slug)
        user = _create_user(admin_username, admin_email, admin_password)
        Membership.objects.create(operator=operator, user=user, role=Role.OPERATOR_ADMIN)
    return operator, user


def do_create_customer(principal: Principal | int, *, name: str, slug: str) -> Customer:
    """A customer of the principal's operator (operator roles only), or of operator `id`."""
    if isinstance(principal, Principal):
        if not (principal.is_operator and principal.can_write):
            raise NotAllowed("only operator roles with write access may create customers")
        operator_id = principal.operator_id
    else:
        operator_id = int(principal)
    name = _clean_name(name, "the customer name")
    _validate(validate_slug, slug, "slug")
    with tenant_context(operator_id):
        if Customer.objects.for_tenant(operator_id).filter(slug=slug).exists():
            raise TenancyError(f"this operator already has a customer with slug {slug!r}")
        try:
            with transaction.atomic():
                return Customer.objects.create(operator_id=operator_id, name=name, slug=slug)
        except IntegrityError:
            raise TenancyError(f"this operator already has a customer with slug {slug!r}") from None


def do_add_membership(
    *, operator_id: int, user: User, role: Role | str, customer_id: int | None = None
) -> Membership:
    """Give `user` a role at the operator (operator roles) or at one of its customers."""
    role = Role(role)
    if role in OPERATOR_ROLES and customer_id is not None:
        raise TenancyError(f"role {role.value} is an operator role and takes no customer")
    if role in CUSTOMER_ROLES and customer_id is None:
        raise TenancyError(f"role {role.value} is a customer role and needs a customer")
    with tenant_context(operator_id):
        if (
            customer_id is not None
            and not Customer.objects.for_tenant(operator_id).filter(pk=customer_id).exists()
        ):
            raise TenancyError(f"customer {customer_id} does not belong to this operator")
        with system_context():
            if Membership.objects.filter(user_id=user.pk).exists():
                raise TenancyError(f"user {user.get_username()!r} already has a membership")
        return Membership.objects.create(
            operator_id=operator_id, user=user, role=role, customer_id=customer_id
        )


def do_create_member(
    *,
    operator_id: int,
    username: str,
    email: str,
    password: str,
    role: Role | str,
    customer_id: int | None = None,
) -> Membership:
    """A new user with a role at the operator or one of its customers."""
    with transaction.atomic():
        user = _create_user(username, email, password)
        membership = do_add_membership(
            operator_id=operator_id, user=user, role=role, customer_id=customer_id
        )
        with tenant_context(operator_id):
            record_audit(operator_id, "membership.create", "membership", membership.pk, customer_id=customer_id, detail={"username": username, "role": str(role)})  # fmt: skip
        return membership


# --- API tokens --------------------------------------------------------------------------------


def do_create_api_token(
    principal: Principal,
    *,
    name: str,
    scope: TokenScope | str,
    customer_id: int | None = None,
    expires_at: datetime | None = None,
    rate_limit: str = "",
) -> tuple[ApiToken, str]:
    """A new API token and its plaintext (shown once; only its hash is kept).

    Customer principals get tokens for their own customer only. Operator principals get
    operator-wide tokens with their own role, or tokens for one of their customers. A token
    never writes unless both its scope and the creating principal allow it; the admin scope
    only an admin acting with admin rights may give. `rate_limit` ("120/min"): the token's own
    request rate, empty for PROOF_API_RATE.
    """
    if not principal.can_write:
        raise NotAllowed("this principal has read-only access and cannot create tokens")
    name = _clean_name(name, "the token name")
    scope = clean_token_scope(scope)
    if scope == TokenScope.ADMIN and not principal.can_admin:
        raise NotAllowed("only an admin with admin rights may create a token of scope 'admin'")
    rate_limit = clean_rate_limit(rate_limit)
    if expires_at is not None and expires_at <= timezone.now():
        raise TenancyError("expires_at must be in the future")
    with tenant_context(principal.operator_id):
        if principal.is_customer:
            if customer_id is not None and customer_id != principal.customer_id:
                raise NotAllowed("customer principals may only create tokens for their customer")
            customer_id, role = principal.customer_id, principal.role
        elif customer_id is not None:
            if not Customer.objects.for_tenant(principal).filter(pk=customer_id).exists():
                raise TenancyError(f"customer {customer_id} does not exist")
            role = Role.CUSTOMER_ADMIN
        else:
            role = principal.role
        plaintext, prefix, digest = new_secret(API_TOKEN_KIND)
        token = ApiToken.objects.create(
            operator_id=principal.operator_id,
            customer_id=customer_id,
            name=name,
            role=role,
            scope=scope,
            prefix=prefix,
            token_hash=digest,
            created_by_id=principal.user_id,
            expires_at=expires_at,
            rate_limit=rate_limit,
        )
        record_audit(principal, "api_token.create", "api_token", token.pk, customer_id=customer_id, detail={"name": name, "prefix": prefix, "role": role, "scope": scope})  # fmt: skip
    return token, plaintext


def clean_token_scope(scope: TokenScope | str) -> TokenScope:
    """A scope by its stored name or its alias ("write" is read_write)."""
    scope = TOKEN_SCOPE_ALIASES.get(str(scope), scope)
    try:
        return TokenScope(scope)
    except ValueError:
        raise TenancyError(
            f"scope {scope!r} must be one of read, write ({TokenScope.READ_WRITE.value}), admin"
        ) from None


_RATE = re.compile(
    r"^(?P<count>[1-9][0-9]{0,6})/(?P<period>s|sec|second|m|min|minute|h|hour|d|day)$"
)


def clean_rate_limit(rate: str | None) -> str:
    """A request rate as DRF reads it ("600/min", "10/s", "5000/hour"), or "" for the default."""
    rate = (rate or "").strip()
    if rate and not _RATE.match(rate):
        raise TenancyError(
            f"rate_limit {rate!r} must read <requests>/<s|min|hour|day>, e.g. '600/min'"
        )
    return rate


def do_revoke_api_token(principal: Principal, token_id: int) -> ApiToken:
    """Revoke a token the principal can see: admins any, others those they created."""
    if not principal.can_write:
        raise NotAllowed("this principal has read-only access and cannot revoke tokens")
    with tenant_context(principal.operator_id):
        token = get_object_for_tenant(ApiToken, principal, pk=token_id)
        own = principal.user_id is not None and token.created_by_id == principal.user_id
        if not (principal.is_admin or own):
            raise NotAllowed("only admins may revoke tokens created by someone else")
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            record_audit(principal, "api_token.revoke", "api_token", token.pk, customer_id=token.customer_id, detail={"prefix": token.prefix})  # fmt: skip
    return token


class TokenRejected(Exception):
    """An API token that does not authenticate; `reason` is safe to show the caller."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _touch(model: type[ApiToken] | type[AgentToken], pk: int, last_used: datetime | None) -> None:
    now = timezone.now()
    if last_used is None or now - last_used >= LAST_USED_RESOLUTION:
        model.objects.filter(pk=pk).update(last_used_at=now)


def authenticate_api_token(plaintext: str) -> Principal:
    """The principal of an API token, or TokenRejected saying why not."""
    if not plaintext.startswith(API_TOKEN_KIND + "_"):
        raise TokenRejected("Invalid API token.")
    # The token is what tells us the tenant, so it is looked up before one is set.
    with system_context():
        token = ApiToken.objects.filter(token_hash=hash_secret(plaintext)).first()
        if token is None:
            raise TokenRejected("Invalid API token.")
        if token.revoked_at is not None:
            raise TokenRejected("This API token has been revoked.")
        if token.expires_at is not None and token.expires_at <= timezone.now():
            raise TokenRejected("This API token has expired.")
        _touch(ApiToken, token.pk, token.last_used_at)
    role = Role(token.role)
    return Principal(
        operator_id=token.operator_id,
        customer_id=token.customer_id,
        role=role,
        can_write=token.scope in (TokenScope.READ_WRITE, TokenScope.ADMIN) and role_can_write(role),
        api_token_id=token.pk,
        admin_scope=token.scope == TokenScope.ADMIN,
        rate_limit=token.rate_limit or None,
    )


# --- agent tokens ------------------------------------------------------------------------------


def _require_operator_admin(principal: Principal, action: str) -> None:
    if principal.role != Role.OPERATOR_ADMIN or not principal.can_admin:
        raise NotAllowed(
            f"only operator admins with admin rights (a session, or a token of scope admin) may "
            f"{action}"
        )


def do_create_agent_token(
    principal: Principal | int, *, name: str, created_by_id: int | None = None
) -> tuple[AgentToken, str]:
    """A new agent token for the operator and its plaintext (shown once)."""
    if isinstance(principal, Principal):
        _require_operator_admin(principal, "create agent tokens")
        operator_id, created_by_id = principal.operator_id, principal.user_id
    else:
        operator_id = int(principal)
    name = _clean_name(name, "the agent token name")
    plaintext, prefix, digest = new_secret(AGENT_TOKEN_KIND)
    with tenant_context(operator_id):
        token = AgentToken.objects.create(
            operator_id=operator_id,
            name=name,
            prefix=prefix,
            token_hash=digest,
            created_by_id=created_by_id,
        )
        record_audit(principal, "agent_token.create", "agent_token", token.pk, detail={"name": name, "prefix": prefix})  # fmt: skip
    return token, plaintext


def do_revoke_agent_token(principal: Principal, token_id: int) -> AgentToken:
    _require_operator_admin(principal, "revoke agent tokens")
    with tenant_context(principal.operator_id):
        token = get_object_for_tenant(AgentToken, principal, pk=token_id)
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            record_audit(principal, "agent_token.revoke", "agent_token", token.pk, detail={"prefix": token.prefix})  # fmt: skip
    return token


def resolve_agent_token(plaintext: str) -> int | None:
    """The operator id an agent token belongs to; None if unknown or revoked.

    Ingest calls this for every stream: the tenant of telemetry comes from here, never
    from the payload.
    """
    ids = resolve_agent_token_ids(plaintext)
    return None if ids is None else ids[0]


def resolve_agent_token_ids(plaintext: str) -> tuple[int, int] | None:
    """(operator id, token id) of an agent token; None if unknown or revoked."""
    if not plaintext or not plaintext.startswith(AGENT_TOKEN_KIND + "_"):
        return None
    with system_context():
        row = (
            AgentToken.objects.filter(token_hash=hash_secret(plaintext), revoked_at__isnull=True)
            .values_list("pk", "operator_id", "last_used_at")
            .first()
        )
        if row is None:
            return None
        pk, operator_id, last_used = row
        _touch(AgentToken, pk, last_used)
    return int(operator_id), int(pk)


# --- job-to-customer mapping ----------------------------------------------------------------


def _clean_rule(match_field: str, value: str, priority: int) -> tuple[MatchField, str, int]:
    try:
        field = MatchField(match_field)
    except ValueError:
        raise TenancyError(
            f"match_field {match_field!r} must be one of {', '.join(MatchField.values)}"
        ) from None
    value = (value or "").strip()
    if not value:
        raise TenancyError("the rule's value must not be empty")
    if len(value) > 255:
        raise TenancyError("the rule's value is longer than 255 characters")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TenancyError(f"priority {priority!r} must be an integer")
    return field, value, priority


def do_create_mapping_rule(
    principal: Principal, *, match_field: str, value: str, customer_id: int, priority: int = 100
) -> JobMappingRule:
    _require_operator_admin(principal, "manage job mapping rules")
    field, value, priority = _clean_rule(match_field, value, priority)
    with tenant_context(principal.operator_id):
        if not Customer.objects.for_tenant(principal).filter(pk=customer_id).exists():
            raise TenancyError(f"customer {customer_id} does not exist")
        if (
            JobMappingRule.objects.for_tenant(principal)
            .filter(match_field=field, value=value)
            .exists()
        ):
            raise TenancyError(f"a rule matching {field.value}={value!r} already exists")
        return JobMappingRule.objects.create(
            operator_id=principal.operator_id,
            match_field=field,
            value=value,
            customer_id=customer_id,
            priority=priority,
        )


def do_update_mapping_rule(principal: Principal, rule_id: int, **changes: Any) -> JobMappingRule:
    _require_operator_admin(principal, "manage job mapping rules")
    unknown = set(changes) - {"match_field", "value", "customer_id", "priority"}
    if unknown:
        raise TenancyError(f"unknown fields: {', '.join(sorted(unknown))}")
    with tenant_context(principal.operator_id):
        rule = get_object_for_tenant(JobMappingRule, principal, pk=rule_id)
        field, value, priority = _clean_rule(
            changes.get("match_field", rule.match_field),
            changes.get("value", rule.value),
            changes.get("priority", rule.priority),
        )
        customer_id = changes.get("customer_id", rule.customer_id)
        if not Customer.objects.for_tenant(principal).filter(pk=customer_id).exists():
            raise TenancyError(f"customer {customer_id} does not exist")
        clash = JobMappingRule.objects.for_tenant(principal).filter(match_field=field, value=value)
        if clash.exclude(pk=rule.pk).exists():
            raise TenancyError(f"a rule matching {field.value}={value!r} already exists")
        rule.match_field, rule.value, rule.priority = field, value, priority
        rule.customer_id = customer_id
        rule.save()
    return rule


def do_delete_mapping_rule(principal: Principal, rule_id: int) -> None:
    _require_operator_admin(principal, "manage job mapping rules")
    with tenant_context(principal.operator_id):
        get_object_for_tenant(JobMappingRule, principal, pk=rule_id).delete()


def rule_matches(match_field: str, value: str, job_attrs: Mapping[str, Any]) -> bool:
    """Whether one rule matches a job's attributes (no database).

    job_attrs keys: slurm_account, slurm_partition, slurm_user, k8s_namespace, job_id. A Slurm
    job submitted to several partitions ("gpu,debug") matches a rule for any one of them.
    """
    if match_field == MatchField.JOB_ID_PREFIX:
        job_id = job_attrs.get("job_id")
        return job_id is not None and str(job_id).startswith(value)
    actual = job_attrs.get(match_field)
    if actual is None or actual == "":
        return False
    if match_field == MatchField.SLURM_PARTITION:
        return value in (part.strip() for part in str(actual).split(","))
    return str(actual) == value


def first_matching_customer_id(
    rules: Iterable[tuple[str, str, int]], job_attrs: Mapping[str, Any]
) -> int | None:
    """The customer id of the first rule (already in priority order) matching the job."""
    for match_field, value, customer_id in rules:
        if rule_matches(match_field, value, job_attrs):
            return customer_id
    return None


def customer_for_job(operator: Operator | int, job_attrs: Mapping[str, Any]) -> Customer | None:
    """The customer a job belongs to under the operator's mapping rules, or None."""
    operator_id = operator.pk if isinstance(operator, Operator) else int(operator)
    with tenant_context(operator_id):
        rules = JobMappingRule.objects.for_tenant(operator_id).order_by("priority", "id")
        customer_id = first_matching_customer_id(
            rules.values_list("match_field", "value", "customer_id"), job_attrs
        )
        if customer_id is None:
            return None
        return Customer.objects.for_tenant(operator_id).get(pk=customer_id)


# --- members: invite, role, activation (the console's users settings) -------------------------
#
# Admins manage the members of their own scope: operator admins every member of the operator,
# customer admins the members of their own customer. A member outside that scope is a 404 (the
# same answer as another operator's), never a 403. Nobody changes their own role or activation:
# an admin locking themself out leaves the tenant to whoever is left, and a demotion of oneself
# is never what the button meant.

# Higher is more: a role "covers" another of the same scope when its rank is at least as high.
_ROLE_RANK = {
    Role.CUSTOMER_VIEWER: 0,
    Role.CUSTOMER_ADMIN: 1,
    Role.OPERATOR_SUPPORT: 2,
    Role.OPERATOR_ADMIN: 3,
}


@dataclass(frozen=True)
class PasswordLink:
    """The two parts of a one-time set-password URL (Django's password-reset tokens): valid
    until the password is set, another link is issued, or PASSWORD_RESET_TIMEOUT passes."""

    uidb64: str
    token: str


def _require_member_admin(principal: Principal, action: str) -> None:
    if not (principal.is_admin and principal.can_write):
        raise NotAllowed(f"only admins with write access may {action}")


def _member_for(principal: Principal, member_id: int, action: str) -> Membership:
    """The membership `member_id` inside the principal's scope (404 otherwise), not their own."""
    membership = (
        Membership.objects.for_tenant(principal).select_related("user").filter(pk=member_id).first()
    )
    if membership is None:
        raise Http404("No membership matches the given query.")
    if principal.user_id is not None and membership.user_id == principal.user_id:
        raise NotAllowed(f"you cannot {action} yourself")
    return membership


def _assignable(
    principal: Principal, role: Role | str, customer_id: int | None
) -> tuple[Role, int | None]:
    """The (role, customer id) the principal may give a member; never above its own scope."""
    try:
        role = Role(role)
    except ValueError:
        raise TenancyError(f"role {role!r} must be one of {', '.join(Role.values)}") from None
    if principal.is_customer:
        if role not in CUSTOMER_ROLES:
            raise NotAllowed("customer admins may give customer roles only")
        if customer_id is not None and customer_id != principal.customer_id:
            raise NotAllowed("customer admins may manage their own customer's members only")
        return role, principal.customer_id
    if role in OPERATOR_ROLES:
        if customer_id is not None:
            raise TenancyError(f"role {role.value} is an operator role and takes no customer")
        return role, None
    if customer_id is None:
        raise TenancyError(f"role {role.value} is a customer role and needs a customer")
    if not Customer.objects.for_tenant(principal).filter(pk=customer_id).exists():
        raise TenancyError(f"customer {customer_id} does not exist")
    return role, customer_id


def _covers(new: Role, new_customer: int | None, old: Role, old_customer: int | None) -> bool:
    """Whether a member moved from (old, old_customer) to (new, new_customer) could have
    created every API token they made before: a raise within the scope, or to operator scope."""
    if new in OPERATOR_ROLES:
        return old in CUSTOMER_ROLES or _ROLE_RANK[new] >= _ROLE_RANK[old]
    return (
        old in CUSTOMER_ROLES
        and new_customer == old_customer
        and _ROLE_RANK[new] >= _ROLE_RANK[old]
    )


def _revoke_tokens_created_by(operator_id: int, user_id: int) -> int:
    """Revoke the live API tokens a member created (a token acts with its creator's role)."""
    return (
        ApiToken.objects.for_tenant(operator_id)
        .filter(created_by_id=user_id, revoked_at__isnull=True)
        .update(revoked_at=timezone.now())
    )


def _password_link(user: User) -> PasswordLink:
    return PasswordLink(
        uidb64=urlsafe_base64_encode(force_bytes(user.pk)),
        token=default_token_generator.make_token(user),
    )


def do_invite_member(
    principal: Principal,
    *,
    username: str,
    email: str = "",
    role: Role | str,
    customer_id: int | None = None,
) -> tuple[Membership, PasswordLink]:
    """A new member with no usable password and the one-time link they set it with.

    Sites are often air-gapped (no mail), so the link goes back to the inviting admin, shown
    once, to pass on; nothing else (no temporary password) is ever known to anyone but the
    member."""
    _require_member_admin(principal, "invite members")
    with tenant_context(principal.operator_id):
        role, customer_id = _assignable(principal, role, customer_id)
        with transaction.atomic():
            user = _create_user(username, (email or "").strip(), None)
            membership = do_add_membership(
                operator_id=principal.operator_id, user=user, role=role, customer_id=customer_id
            )
            record_audit(principal, "membership.invite", "membership", membership.pk, customer_id=customer_id, detail={"username": username, "role": str(role)})  # fmt: skip
    return membership, _password_link(user)


def do_issue_password_link(principal: Principal, member_id: int) -> tuple[Membership, PasswordLink]:
    """A new one-time set-password link for a member (a lost invitation, a forgotten password).

    The member's current password stops working at once and their sessions end (Django ties
    sessions to the password hash); any earlier link stops working too."""
    _require_member_admin(principal, "issue set-password links")
    with tenant_context(principal.operator_id):
        membership = _member_for(principal, member_id, "issue a set-password link for")
        user = membership.user
        if not user.is_active:
            raise TenancyError(f"{user.get_username()!r} is deactivated; reactivate them first")
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return membership, _password_link(user)


def do_change_member_role(
    principal: Principal, member_id: int, *, role: Role | str, customer_id: int | None = None
) -> Membership:
    """Give a member another role (and, for customer roles, customer). The API tokens they
    created are revoked unless the new role could have created them too (see _covers)."""
    _require_member_admin(principal, "change roles")
    with tenant_context(principal.operator_id):
        membership = _member_for(principal, member_id, "change the role of")
        new_role, new_customer = _assignable(principal, role, customer_id)
        old_role, old_customer = Role(membership.role), membership.customer_id
        if (new_role, new_customer) == (old_role, old_customer):
            return membership
        membership.role, membership.customer_id = new_role, new_customer
        membership.save(update_fields=["role", "customer"])
        record_audit(principal, "membership.role_change", "membership", membership.pk, customer_id=new_customer, detail={"from": str(old_role), "to": str(new_role)})  # fmt: skip
        if not _covers(new_role, new_customer, old_role, old_customer):
            _revoke_tokens_created_by(principal.operator_id, membership.user_id)
    return membership


def do_set_member_active(principal: Principal, member_id: int, *, active: bool) -> Membership:
    """Deactivate a member (they can no longer sign in, their sessions end, and the API tokens
    they created are revoked) or reactivate one (revoked tokens stay revoked)."""
    _require_member_admin(principal, "deactivate or reactivate members")
    with tenant_context(principal.operator_id):
        membership = _member_for(principal, member_id, "deactivate" if not active else "reactivate")
        user = membership.user
        if user.is_active != active:
            user.is_active = active
            user.save(update_fields=["is_active"])
            record_audit(principal, "membership.activate" if active else "membership.deactivate", "membership", membership.pk, customer_id=membership.customer_id)  # fmt: skip
        if not active:
            _revoke_tokens_created_by(principal.operator_id, user.pk)
    return membership


# --- operator settings ---------------------------------------------------------------------


def do_set_mask_node_names(principal: Principal, *, mask: bool) -> Operator:
    """Whether the operator's customer-facing verdict pages and share links show aliases
    ("node-1", "gpu-1") instead of its hostnames and GPU UUIDs. Operator admins only."""
    _require_operator_admin(principal, "change how node names are shown to customers")
    with tenant_context(principal.operator_id):
        Operator.objects.filter(pk=principal.operator_id).update(mask_node_names=bool(mask))
        return Operator.objects.get(pk=principal.operator_id)
