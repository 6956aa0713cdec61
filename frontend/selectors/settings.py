"""Reads of the settings pages: each page is one selector call, a fixed number of queries
whatever the number of rows (lists are paginated; what a page's rows count is one GROUP BY
over the page's ids, never a query per row)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Generic, TypeVar

from django.db.models import Count, Max, Q, QuerySet
from django.utils import timezone

from ingest.models import Gpu, Job, Node
from investigations.models import GpuListPrice
from tenants.access import Principal
from tenants.models import (
    AgentToken,
    ApiToken,
    Customer,
    JobMappingRule,
    Membership,
    Operator,
)

PAGE_SIZE = 50

# An agent that has sent nothing for this long is shown as silent, the fleet page's threshold
# (a node's last_seen_at moves at most every 30 s; ten minutes outlasts an agent restart).
AGENT_SILENT_AFTER = timedelta(minutes=10)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class BadParameter(ValueError):
    """A query parameter the page cannot use; the view answers 400 with the message."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


@dataclass(frozen=True)
class Page(Generic[T_co]):
    rows: Sequence[T_co]
    number: int
    count: int
    size: int = PAGE_SIZE

    @property
    def num_pages(self) -> int:
        return max(1, -(-self.count // self.size))

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.num_pages

    @property
    def previous_number(self) -> int:
        return self.number - 1

    @property
    def next_number(self) -> int:
        return self.number + 1


def page_number(raw: str | None) -> int:
    """The `page` query parameter: a positive integer, 1 when absent."""
    if raw is None or raw == "":
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise BadParameter("page", f"must be a positive whole number, got {raw!r}")
    return int(raw)


def _paginate(queryset: QuerySet[Any, T], number: int) -> Page[T]:
    """Two queries: the count and the page's rows."""
    count = queryset.count()
    page: Page[T] = Page(rows=[], number=number, count=count)
    if number > page.num_pages:
        raise BadParameter("page", f"page {number} is past the last page ({page.num_pages})")
    start = (number - 1) * PAGE_SIZE
    return Page(rows=list(queryset[start : start + PAGE_SIZE]), number=number, count=count)


def _counts(queryset: QuerySet[Any, Any], field: str, ids: Sequence[int]) -> dict[int, int]:
    """Rows of `queryset` per `field` value among `ids` (one GROUP BY over the field's index).

    Counted for the page's rows only, after the page is read: as a correlated subquery in the
    page's query, PostgreSQL evaluated it for every row before the OFFSET (1,000 subqueries to
    show page 20 of the agents)."""
    if not ids:
        return {}
    rows = (
        queryset.filter(**{f"{field}__in": ids})
        .order_by()
        .values_list(field)
        .annotate(n=Count("*"))
        .values_list(field, "n")
    )
    return {int(key): int(n) for key, n in rows}


# --- customers and job-mapping rules ------------------------------------------------------------


@dataclass(frozen=True)
class CustomerRow:
    customer: Customer
    members: int
    rules: int
    jobs: int


def customers_page(principal: Principal, number: int) -> Page[CustomerRow]:
    """The operator's customers with their members, rules and jobs counted (5 queries)."""
    operator_id = principal.operator_id
    page = _paginate(Customer.objects.for_tenant(principal).order_by("name", "id"), number)
    ids = [customer.pk for customer in page.rows]
    members = _counts(Membership.objects.for_tenant(operator_id), "customer_id", ids)
    rules = _counts(JobMappingRule.objects.for_tenant(operator_id), "customer_id", ids)
    jobs = _counts(Job.objects.for_tenant(operator_id), "customer_id", ids)
    rows = [
        CustomerRow(
            customer=c,
            members=members.get(c.pk, 0),
            rules=rules.get(c.pk, 0),
            jobs=jobs.get(c.pk, 0),
        )
        for c in page.rows
    ]
    return Page(rows=rows, number=page.number, count=page.count)


def customer_choices(principal: Principal) -> list[tuple[int, str]]:
    """(id, name) of every customer the principal may pick in a form (1 query)."""
    return list(
        Customer.objects.for_tenant(principal).order_by("name", "id").values_list("id", "name")
    )


def rules_page(principal: Principal, number: int) -> Page[JobMappingRule]:
    """Mapping rules in the order ingest applies them: lowest priority first, then oldest."""
    queryset = (
        JobMappingRule.objects.for_tenant(principal)
        .select_related("customer")
        .order_by("priority", "id")
    )
    return _paginate(queryset, number)


# --- agents ------------------------------------------------------------------------------------

AGENT_SORTS = {
    "hostname": ("hostname", "id"),
    "-hostname": ("-hostname", "-id"),
    "last_seen": ("last_seen_at", "hostname"),
    "-last_seen": ("-last_seen_at", "hostname"),
    "version": ("agent_version", "hostname"),
    "-version": ("-agent_version", "hostname"),
}


def agent_sort(raw: str | None) -> str:
    if raw is None or raw == "":
        return "hostname"
    if raw not in AGENT_SORTS:
        raise BadParameter("sort", f"must be one of {', '.join(AGENT_SORTS)}, got {raw!r}")
    return raw


@dataclass(frozen=True)
class AgentVersion:
    version: str
    nodes: int
    silent: int
    last_seen_at: datetime | None


@dataclass(frozen=True)
class AgentsOverview:
    tokens: list[AgentToken]
    nodes_per_token: dict[int, int]  # token id → nodes whose agent last registered with it
    versions: list[AgentVersion]
    agents: Page[Mapping[str, Any]]
    silent_before: datetime


def agents_overview(principal: Principal, number: int, sort: str) -> AgentsOverview:
    """Agent tokens, the agent versions running (nodes per version, how many silent) and one
    page of the agents seen, one row per node, with its GPUs counted (7 queries)."""
    silent_before = timezone.now() - AGENT_SILENT_AFTER
    tokens = list(
        AgentToken.objects.for_tenant(principal)
        .select_related("created_by")
        .order_by("revoked_at", "-created_at", "-id")
    )
    nodes = Node.objects.for_tenant(principal)
    nodes_per_token = dict(
        nodes.filter(agent_token__isnull=False)
        .order_by()
        .values("agent_token")
        .annotate(n=Count("id"))
        .values_list("agent_token", "n")
    )
    for token in tokens:
        token.node_count = nodes_per_token.get(token.pk, 0)  # type: ignore[attr-defined]
    versions = [
        AgentVersion(
            version=row["agent_version"],
            nodes=row["nodes"],
            silent=row["silent"],
            last_seen_at=row["last_seen_at"],
        )
        for row in nodes.order_by()
        .values("agent_version")
        .annotate(
            nodes=Count("id"),
            silent=Count(
                "id", filter=Q(last_seen_at__lt=silent_before) | Q(last_seen_at__isnull=True)
            ),
            last_seen_at=Max("last_seen_at"),
        )
        .order_by("-nodes", "agent_version")
    ]
    page = _paginate(
        nodes.order_by(*AGENT_SORTS[sort]).values(
            "id", "hostname", "agent_id", "agent_version", "last_seen_at"
        ),
        number,
    )
    gpus = _counts(Gpu.objects.for_tenant(principal), "node_id", [row["id"] for row in page.rows])
    agents = Page(
        rows=[{**row, "gpu_count": gpus.get(row["id"], 0)} for row in page.rows],
        number=page.number,
        count=page.count,
    )
    return AgentsOverview(
        tokens=tokens,
        nodes_per_token=nodes_per_token,
        versions=versions,
        agents=agents,
        silent_before=silent_before,
    )


# --- API tokens --------------------------------------------------------------------------------


def api_tokens_page(principal: Principal, number: int) -> Page[ApiToken]:
    """The API tokens the principal may see (a customer admin: its customer's only), live
    ones first, newest first."""
    queryset = (
        ApiToken.objects.for_tenant(principal)
        .select_related("customer", "created_by")
        .order_by("revoked_at", "-created_at", "-id")
    )
    return _paginate(queryset, number)


# --- GPU list prices ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PriceRow:
    gpu_model: str
    gpus: int
    price: GpuListPrice | None

    @property
    def price_per_gpu_hour(self) -> Decimal | None:
        return None if self.price is None else self.price.price_per_gpu_hour


def price_rows(principal: Principal) -> list[PriceRow]:
    """One row per GPU model that has a list price or is in the fleet: the fleet's models
    without a price are the ones the real price cannot be computed for (2 queries)."""
    prices = {p.gpu_model: p for p in GpuListPrice.objects.for_tenant(principal)}
    fleet = dict(
        Gpu.objects.for_tenant(principal)
        .exclude(model="")
        .order_by()
        .values("model")
        .annotate(n=Count("id"))
        .values_list("model", "n")
    )
    models = sorted(set(prices) | set(fleet))
    return [PriceRow(gpu_model=m, gpus=fleet.get(m, 0), price=prices.get(m)) for m in models]


# --- users and roles ---------------------------------------------------------------------------


def members_page(principal: Principal, number: int) -> Page[Membership]:
    """The members the principal manages (an operator admin: the operator's, a customer admin:
    its customer's), by username (2 queries)."""
    queryset = (
        Membership.objects.for_tenant(principal)
        .select_related("user", "customer")
        .order_by("user__username", "id")
    )
    return _paginate(queryset, number)


def member(principal: Principal, member_id: int) -> Membership | None:
    return (
        Membership.objects.for_tenant(principal)
        .select_related("user", "customer")
        .filter(pk=member_id)
        .first()
    )


def masks_node_names(principal: Principal) -> bool:
    """Whether the operator's customer summaries and share links alias its node names."""
    return bool(
        Operator.objects.filter(pk=principal.operator_id)
        .values_list("mask_node_names", flat=True)
        .first()
    )
