"""The audit page's reads (/settings/audit/, operator admins): the operator's audit log
(tenants/audit.py: sign-ins, tokens, share links, members and roles, incident actions) and the
opens of its customer-facing share pages (investigations' ShareLinkOpen, one row per view)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from operator import or_

from django.db.models import Q, QuerySet

from frontend.selectors.settings import BadParameter, Page, _paginate
from investigations.models import ShareLinkOpen
from tenants.access import Principal
from tenants.context import tenant_context
from tenants.models import AuditEvent

# ?kind= → the action prefixes it shows (None: every entry). "views" shows share-page opens.
KINDS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "all": ("Everything", None),
    "sign-ins": ("Sign-ins", ("login.",)),
    "tokens": ("Tokens", ("api_token.", "agent_token.")),
    "share-links": ("Share links", ("share_link.",)),
    "members": ("Members and roles", ("membership.",)),
    "incidents": ("Incidents", ("incident.",)),
    "views": ("Customer-page views", None),
}
RECENT_VIEWS = 10


def audit_kind(raw: str | None) -> str:
    if raw is None or raw == "":
        return "all"
    if raw not in KINDS:
        raise BadParameter("kind", f"must be one of {', '.join(KINDS)}, got {raw!r}")
    return raw


@dataclass(frozen=True)
class AuditPage:
    kind: str
    events: Page[AuditEvent] | None  # None on the views tab
    views: Page[ShareLinkOpen] | None  # the views tab: every open, paginated
    recent_views: list[ShareLinkOpen]  # the other tabs: the newest few opens


def _opens(principal: Principal) -> QuerySet[ShareLinkOpen]:
    return (
        ShareLinkOpen.objects.for_tenant(principal)
        .select_related("link__incident", "link__created_by")
        .order_by("-opened_at", "-id")
    )


def audit_page(principal: Principal, kind: str, number: int) -> AuditPage:
    """Two or three queries whatever the number of rows: a count and a page (and, outside the
    views tab, the newest share-page opens)."""
    with tenant_context(principal.operator_id):
        if kind == "views":
            return AuditPage(kind, None, _paginate(_opens(principal), number), [])
        events = AuditEvent.objects.for_tenant(principal).select_related("customer")
        prefixes = KINDS[kind][1]
        if prefixes:
            events = events.filter(reduce(or_, (Q(action__startswith=p) for p in prefixes)))
        page = _paginate(events.order_by("-at", "-id"), number)
        recent = list(_opens(principal)[:RECENT_VIEWS]) if kind == "all" else []
        return AuditPage(kind, page, None, recent)
