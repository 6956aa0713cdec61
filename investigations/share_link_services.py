"""Share links (docs/notifications.md): create, revoke, open. Apart from services.py (which
re-exports them) to keep that module under the house's size; the same rules as every service:
each owns its transaction and writes its audit entry in it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.http import Http404
from django.utils import timezone

from investigations.models import Incident, ShareLink, ShareLinkOpen
from tenants.access import Principal
from tenants.audit import record_audit
from tenants.context import system_context, tenant_context
from tenants.models import Role
from tenants.services import NotAllowed, TenancyError
from tenants.tokens import hash_secret, new_secret

SHARE_TOKEN_KIND = "prfs"  # noqa: S105 - a share token's public kind prefix, not a secret
# A link lives at least a minute (long enough to paste into a chat) and at most 30 days: a
# verdict is about a job that is running now; a month-old link is a leak waiting to happen.
SHARE_MIN_EXPIRES_S = 60
SHARE_MAX_EXPIRES_S = 30 * 24 * 3600
USER_AGENT_MAX = 500


def _require_share_manager(principal: Principal, action: str) -> None:
    """Operator roles and customer admins, with write access (a read-only token cannot)."""
    if not principal.can_write or principal.role == Role.CUSTOMER_VIEWER:
        raise NotAllowed(f"only operator roles and customer admins with write access may {action}")


def do_create_share_link(
    principal: Principal, *, incident: uuid.UUID, expires_in_s: int
) -> tuple[ShareLink, str]:
    """A new share link to one incident the principal may see, and its token (shown once: only
    its SHA-256 is stored). Another tenant's or another customer's incident is Http404."""
    _require_share_manager(principal, "create share links")
    if isinstance(expires_in_s, bool) or not isinstance(expires_in_s, int):
        raise TenancyError("expires_in_s must be a whole number of seconds")
    if not SHARE_MIN_EXPIRES_S <= expires_in_s <= SHARE_MAX_EXPIRES_S:
        raise TenancyError(
            f"expires_in_s must be between {SHARE_MIN_EXPIRES_S} and {SHARE_MAX_EXPIRES_S}"
        )
    with tenant_context(principal.operator_id):
        row = Incident.objects.for_tenant(principal).filter(public_id=incident).first()
        if row is None:
            raise Http404("No such incident.")
        plaintext, _prefix, digest = new_secret(SHARE_TOKEN_KIND)
        link = ShareLink.objects.create(
            operator_id=principal.operator_id,
            incident=row,
            token_hash=digest,
            created_by_id=principal.user_id,
            expires_at=timezone.now() + timedelta(seconds=expires_in_s),
        )
        record_audit(
            principal,
            "share_link.create",
            "share_link",
            link.pk,
            detail={"incident": str(row.public_id), "expires_at": link.expires_at.isoformat()},
        )
    return link, plaintext


def do_revoke_share_link(principal: Principal, link_id: int) -> ShareLink:
    """Revoke at once: the next open of the URL is refused. A link the principal may not see,
    or one already revoked, is Http404."""
    _require_share_manager(principal, "revoke share links")
    with tenant_context(principal.operator_id):
        link = (
            ShareLink.objects.for_tenant(principal)
            .select_for_update(of=("self",))
            .filter(pk=link_id, revoked_at__isnull=True)
            .first()
        )
        if link is None:
            raise Http404("No such share link.")
        link.revoked_at = timezone.now()
        link.save(update_fields=["revoked_at"])
        record_audit(principal, "share_link.revoke", "share_link", link.pk)
    return link


class ShareRefused(Exception):
    """A share token that opens nothing: `gone` when it was a link that expired or was
    revoked (HTTP 410), else unknown (HTTP 404)."""

    def __init__(self, reason: str, *, gone: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.gone = gone


@dataclass(frozen=True)
class OpenedShare:
    link: ShareLink  # with its incident, the incident's job and the operator loaded
    # Whom the page reads as: the job's customer (read-only) when the incident's job has one —
    # the same scope that customer's own users have, charts clipped to the job's data — else
    # the operator, read-only (a fleet-health incident, or a job no customer owns).
    reader: Principal


def open_share_link(plaintext: str, *, address: str | None, user_agent: str) -> OpenedShare:
    """Resolve a share token and log the open; ShareRefused when it opens nothing. The row is
    read on every open (never cached), so a revoke or an expiry holds from the next request."""
    if not plaintext.startswith(SHARE_TOKEN_KIND + "_") or len(plaintext) > 100:
        raise ShareRefused("No such share link.", gone=False)
    # The token is what names the tenant, so it is looked up before one is set.
    with system_context():
        link = (
            ShareLink.objects.select_related("incident__job", "operator")
            .filter(token_hash=hash_secret(plaintext))
            .first()
        )
    if link is None:
        raise ShareRefused("No such share link.", gone=False)
    if link.revoked_at is not None:
        raise ShareRefused("This share link has been revoked.", gone=True)
    if link.expires_at <= timezone.now():
        raise ShareRefused("This share link has expired.", gone=True)
    with tenant_context(link.operator_id):
        ShareLinkOpen.objects.create(
            operator_id=link.operator_id,
            link=link,
            address=address or None,
            user_agent=user_agent[:USER_AGENT_MAX],
        )
    job = link.incident.job
    customer_id = job.customer_id if job is not None else None
    reader = Principal(
        operator_id=link.operator_id,
        customer_id=customer_id,
        role=Role.CUSTOMER_VIEWER if customer_id is not None else Role.OPERATOR_SUPPORT,
        can_write=False,
    )
    return OpenedShare(link, reader)
