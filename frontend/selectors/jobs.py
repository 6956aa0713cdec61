"""Reads of the jobs list (`/jobs/`): one page of the jobs a principal may see, with what each
row shows computed in SQL for the whole page (counts, shares) and the real price of the page's
50 jobs from one grouped usage query.

    params = list_params(request.GET, principal)   # BadParameter (→ 400) names the parameter
    page = job_list_page(principal, params)

Operators see every job of theirs; customer users their customer's only (`for_tenant`), and row
level security is the second wall (the request runs in the operator's tenant context).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db.models import (
    F,
    Q,
    QuerySet,
)

from ingest.models import Job, JobState
from investigations.pricing import RealPrice
from investigations.selectors_jobs import (
    annotated_jobs,
    list_price_per_gpu_hour,
    node_count_of,
    page_prices,
)
from tenants.access import Principal
from tenants.models import Customer

PAGE_SIZE = 50
# `?q=` longer than this is not a job id or name anyone typed (ids are ≤ 255 characters).
MAX_QUERY_LEN = 255
# The job kinds the trace format knows (docs/trace-format.md, `job.kind`).
KINDS = ("training", "inference")


class BadParameter(ValueError):
    """A query parameter the page cannot use; the view answers 400 naming it."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


# `?sort=` keys and the column (or annotation) each orders by. Ties fall back to the newest job.
SORT_KEYS: dict[str, str] = {
    "started": "first_seen_at",
    "job": "job_id",
    "name": "name",
    "state": "state",
    "kind": "kind",
    "customer": "customer__name",
    "gpus": "gpu_count",
    "nodes": "node_count",
    "duration": "duration_s",
    "share": "share",
    "incidents": "open_incidents",
}
DEFAULT_SORT = "-started"


@dataclass(frozen=True)
class ListParams:
    q: str = ""
    state: str = ""
    kind: str = ""
    customer_id: int | None = None
    sort: str = DEFAULT_SORT
    page: int = 1

    def query(self, **changes: Any) -> str:
        """This page's query string with `changes` (sort links, page links keep the filters)."""
        from urllib.parse import urlencode

        values: dict[str, Any] = {
            "q": self.q,
            "state": self.state,
            "kind": self.kind,
            "customer": self.customer_id,
            "sort": self.sort if self.sort != DEFAULT_SORT else None,
            "page": self.page if self.page != 1 else None,
        }
        values.update(changes)
        return urlencode({k: v for k, v in values.items() if v not in (None, "")})


def _one(query: Mapping[str, Any], name: str) -> str:
    value = query.get(name, "")
    return str(value).strip()


def list_params(query: Mapping[str, Any], principal: Principal) -> ListParams:
    """The list's parameters from a query string; BadParameter names the first bad one.

    `customer` must be a customer the principal may see (operators: any of theirs; a customer
    user: its own); `page` a positive integer (a page past the last shows the last page)."""
    q = _one(query, "q")
    if len(q) > MAX_QUERY_LEN:
        raise BadParameter("q", f"at most {MAX_QUERY_LEN} characters")
    state = _one(query, "state")
    if state and state not in JobState.values:
        raise BadParameter("state", f"one of {', '.join(JobState.values)}, not {state!r}")
    kind = _one(query, "kind")
    if kind and kind not in KINDS:
        raise BadParameter("kind", f"one of {', '.join(KINDS)}, not {kind!r}")
    customer_id: int | None = None
    raw_customer = _one(query, "customer")
    if raw_customer:
        if not raw_customer.isdigit():
            raise BadParameter("customer", f"a customer id, not {raw_customer!r}")
        customer_id = int(raw_customer)
        if not Customer.objects.for_tenant(principal).filter(pk=customer_id).exists():
            raise BadParameter("customer", f"no customer {customer_id} here")
    sort = _one(query, "sort") or DEFAULT_SORT
    if sort.removeprefix("-") not in SORT_KEYS:
        keys = ", ".join(sorted(SORT_KEYS))
        raise BadParameter("sort", f"one of {keys} (prefix - for descending), not {sort!r}")
    raw_page = _one(query, "page") or "1"
    if not raw_page.isdigit() or int(raw_page) < 1:
        raise BadParameter("page", f"a page number from 1, not {raw_page!r}")
    return ListParams(q, state, kind, customer_id, sort, int(raw_page))


@dataclass(frozen=True)
class JobRow:
    job: Job
    gpus: int | None
    nodes: int | None
    duration_s: float | None
    open_incidents: int
    price: RealPrice

    @property
    def list_price_per_gpu_hour(self) -> Decimal | None:
        return list_price_per_gpu_hour(self.price)


@dataclass(frozen=True)
class JobListPage:
    rows: list[JobRow]
    params: ListParams
    number: int
    pages: int
    total: int
    customers: list[tuple[int, str]] = field(default_factory=list)  # the filter's choices

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.pages


def _filtered(principal: Principal, params: ListParams) -> QuerySet[Job]:
    qs = annotated_jobs(principal)
    if params.q:
        qs = qs.filter(Q(job_id__icontains=params.q) | Q(name__icontains=params.q))
    if params.state:
        qs = qs.filter(state=params.state)
    if params.kind:
        qs = qs.filter(kind=params.kind)
    if params.customer_id is not None:
        qs = qs.filter(customer_id=params.customer_id)
    key = SORT_KEYS[params.sort.removeprefix("-")]
    descending = params.sort.startswith("-")
    order = F(key).desc(nulls_last=True) if descending else F(key).asc(nulls_last=True)
    return qs.order_by(order, "-pk" if descending else "pk")


def job_list_page(principal: Principal, params: ListParams) -> JobListPage:
    qs = _filtered(principal, params)
    total = qs.count()
    pages = max(1, -(-total // PAGE_SIZE))
    number = min(params.page, pages)
    start = (number - 1) * PAGE_SIZE
    jobs = list(qs[start : start + PAGE_SIZE])
    prices = page_prices(principal.operator_id, [j.pk for j in jobs])
    rows = [
        JobRow(
            job=j,
            gpus=j.gpu_count,  # type: ignore[attr-defined]
            nodes=node_count_of(j, j.node_count),  # type: ignore[attr-defined]
            duration_s=j.duration_s,  # type: ignore[attr-defined]
            open_incidents=int(j.open_incidents),  # type: ignore[attr-defined]
            price=prices[j.pk],
        )
        for j in jobs
    ]
    customers: list[tuple[int, str]] = []
    if principal.is_operator:
        customers = [
            (int(pk), str(name))
            for pk, name in Customer.objects.for_tenant(principal).values_list("pk", "name")
        ]
    return JobListPage(rows, params, number, pages, total, customers)
