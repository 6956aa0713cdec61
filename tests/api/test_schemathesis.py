"""schemathesis over every operation of /api/v1/, against the real server (pytest-django's
live server on loopback) and its own published schema, as three principals: an operator admin,
a customer admin of the same operator and another operator's admin.

Two parts:
- Tenancy, with real ids of a seeded world (stored jobs, incidents, tokens, rules, a channel, a
  share link): every operation that takes an id, called by the other operator's token on this
  operator's id, is 404 (whatever the method); a detail the customer cannot see among this
  operator's rows is 403 or 404, never a 2xx.
- Fuzzing: for each operation and principal, PROOF_SCHEMATHESIS_EXAMPLES generated requests
  (default 10), each checked by not_a_server_error, status_code_conformance,
  content_type_conformance and response_schema_conformance.

It prints how many operations and cases ran; any failure lists each operation, principal and
check that failed.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest
import requests
import schemathesis
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from contract import signals
from ingest import services as ingest_services
from ingest.processing import Limits, decode_batch
from ingest.tests.helpers import gpu_batch
from investigations import ask_services
from investigations import services as investigation_services
from investigations.models import ComponentForecast, Incident, JobGpuUsage
from investigations.tests.live_helpers import job_pk, verdict
from notify import services as notify_services
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.models import MatchField, TokenScope
from tenants.testing import Tenant, make_tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MAX_EXAMPLES = int(os.environ.get("PROOF_SCHEMATHESIS_EXAMPLES", "10"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Far above what the run sends: the throttle is tested on its own (tenants/tests).
UNTHROTTLED = "1000000/min"
_PARAM = re.compile(r"\{([^}]+)\}")
# Where a path's ids are listed, when not under the path itself: a verdict is looked up by its
# incident's public id (the verdict object's own "id" is the engine's).
_LISTED_AT = {"/api/v1/verdicts/": "/api/v1/incidents/"}
# A required query parameter the schema gives no example of.
_QUERY_FALLBACK = {"signal": signals.DCGM_FI_DEV_GPU_UTIL}


@dataclass
class World:
    a: Tenant
    b: Tenant
    base_url: str
    tokens: dict[str, str] = field(default_factory=dict)

    def mint(self) -> None:
        """Fresh tokens of the three principals (a fuzzed request may revoke one)."""
        for name, tenant, user in (
            ("operator", self.a, self.a.operator_admin),
            ("customer", self.a, self.a.customer_admin),
            ("other operator", self.b, self.b.operator_admin),
        ):
            _token, plaintext = tenant_services.do_create_api_token(
                tenant.principal(user),
                name=f"schemathesis {name}",
                scope=TokenScope.ADMIN,
                rate_limit=UNTHROTTLED,
            )
            self.tokens[name] = plaintext

    def headers(self, principal: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[principal]}"}


def _incident(tenant: Tenant, job: str | None, job_pk: int | None, family: str) -> None:
    op = tenant.operator.pk
    scope: dict[str, Any] = {"job_pk": job_pk} if job_pk is not None else {"gpu": "GPU-x-7"}
    with tenant_context(op):
        investigation_services.merge_verdicts(
            op,
            [verdict(family, "infrastructure" if job is None else "job", job=job, gpu=None)],
            window_end=1_100,
            **scope,
        )


def _seed(tenant: Tenant, prefix: str) -> None:
    """One operator's rows behind every resource: jobs of its customer and of another, their
    incidents, usage, a fleet incident, a rule, an agent token, a price, a channel, a link."""
    admin = tenant.principal(tenant.operator_admin)
    other = tenant_services.do_create_customer(admin, name=f"{prefix} other", slug=f"{prefix}-o")
    for job_prefix, customer in (("acme-", tenant.customer.pk), ("other-", other.pk)):
        tenant_services.do_create_mapping_rule(
            admin, match_field=MatchField.JOB_ID_PREFIX, value=job_prefix, customer_id=customer
        )
    tenant_services.do_create_agent_token(admin, name="rack 1")
    jobs: dict[str, int] = {}
    # Job ids and host names of each operator's own (a same-named job of the other operator
    # would answer 200 to it, rightly).
    for n, job in enumerate((f"acme-{prefix}-1", f"other-{prefix}-1")):
        node, agent = f"{prefix}-node-{n}", f"{prefix}-agent-{n}"
        ingest_services.register_agent(
            tenant.operator.pk,
            agent_id=agent,
            hostname=node,
            agent_version="test",
            gpus=[{"uuid": f"GPU-{node}-{i}", "index": i, "model": "H100"} for i in range(2)],
        )
        batch = decode_batch(gpu_batch(agent_id=agent, node=node, job=job), Limits())
        ingest_services.store_batch(tenant.operator.pk, batch)
        jobs[job] = job_pk(tenant.operator.pk, job)
    for n, (job, pk) in enumerate(jobs.items()):
        _incident(tenant, job, pk, "sequence_imbalance")
        with tenant_context(tenant.operator.pk):
            JobGpuUsage.objects.create(
                operator_id=tenant.operator.pk,
                job_id=pk,
                gpu=f"GPU-{prefix}-node-{n}-0",
                gpu_model="H100",
                gpu_seconds=3600.0,
                compute_seconds=1800.0,
                wait_seconds=1800.0,
                idle_seconds=0.0,
                method="engine+ebpf",
            )
    _incident(tenant, None, None, "gpu_degrading")
    investigation_services.set_list_price(
        admin, gpu_model="H100", price_per_gpu_hour=Decimal("2.50"), currency="USD"
    )
    notify_services.do_create_channel(
        admin,
        name="hook",
        kind="webhook",
        target="http://127.0.0.1:9/hook",
        addresses=[],
        enabled=True,
        rules=[],
    )
    with tenant_context(tenant.operator.pk):
        incident = Incident.objects.for_tenant(tenant.operator.pk).filter(job__isnull=False)[0]
    investigation_services.do_create_share_link(
        admin, incident=incident.public_id, expires_in_s=3600
    )
    # A question about it (its answer task is enqueued on the test's in-memory broker and never
    # run: the row stays pending, which is a state the API serves).
    ask_services.do_ask(admin, incident.public_id, "Which rank is slow?")
    # A days-ahead forecast of one of its GPUs (the hourly pass writes these; docs/fleet-health.md).
    now = timezone.now()
    with tenant_context(tenant.operator.pk):
        ComponentForecast.objects.create(
            operator_id=tenant.operator.pk,
            kind="gpu",
            key=f"GPU-{prefix}-node-0-0",
            node=f"{prefix}-node-0",
            gpu=f"GPU-{prefix}-node-0-0",
            level="watch",
            risk_1d=0.05,
            risk_3d=0.2,
            risk_7d=0.4,
            ttf_hours=120.0,
            summary="correctable remaps rising",
            result={"evidence": [], "daily": {}},
            evaluated_at=now,
            level_since=now,
        )


@pytest.fixture
def world(live_server: Any) -> World:
    a, b = make_tenant("sta"), make_tenant("stb")
    _seed(a, "sta")
    _seed(b, "stb")
    seeded = World(a=a, b=b, base_url=live_server.url)
    seeded.mint()
    return seeded


def _rows(body: Any) -> list[dict[str, Any]]:
    if isinstance(body, dict) and isinstance(body.get("results"), list):
        return [row for row in body["results"] if isinstance(row, dict)]
    if isinstance(body, list):
        return [row for row in body if isinstance(row, dict)]
    return []


def _collection_of(path: str) -> str:
    """Where the ids of `path` are listed: "/api/v1/jobs/{job_id}/series/" -> "/api/v1/jobs/"."""
    collection = path[: path.index("{")]
    return _LISTED_AT.get(collection, collection)


def _field(row: dict[str, Any], name: str) -> Any:
    """A path parameter's value in a listed row: the field of its name, else the row's id (a
    lookup by public id shows it as "id")."""
    return row.get(name, row.get("id"))


def _list(world: World, principal: str, path: str) -> list[dict[str, Any]]:
    response = requests.get(
        world.base_url + path,
        headers=world.headers(principal),
        params={"page_size": 500},
        timeout=30,
    )
    return _rows(response.json()) if response.status_code == 200 else []


def _real_ids(
    world: World, path: str, known: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """Path parameters of a real row of the operator's, from its collection's list. A nested
    path's inner id ("/incidents/{incident_public_id}/questions/{public_id}/") comes from the
    inner collection, listed under each outer row in turn until one has a row."""
    names = _PARAM.findall(path)
    known = known or {}
    if len(known) == len(names):
        return known
    name = names[len(known)]
    prefix = path[: path.index("{" + name + "}")]
    if not known and len(names) == 1:
        prefix = _collection_of(path)
    for row in _list(world, "operator", prefix.format(**known)):
        value = _field(row, name)
        if value is not None:
            found = _real_ids(world, path, {**known, name: value})
            if found is not None:
                return found
    return None


def _required_query(operation: dict[str, Any]) -> dict[str, Any]:
    """A value for each required query parameter: its example, first enum value or default."""
    query: dict[str, Any] = {}
    for parameter in operation.get("parameters", []):
        if parameter.get("in") != "query" or not parameter.get("required"):
            continue
        schema = parameter.get("schema", {})
        examples = [e.get("value") for e in parameter.get("examples", {}).values()]
        candidates = [parameter.get("example"), *examples, *schema.get("enum", [])[:1]]
        candidates += [schema.get("default"), _QUERY_FALLBACK.get(parameter["name"])]
        query[parameter["name"]] = next(c for c in candidates if c is not None)
    return query


def _request_example(operation: dict[str, Any]) -> Any:
    content = operation.get("requestBody", {}).get("content", {})
    for media in content.values():
        for example in media.get("examples", {}).values():
            return example.get("value")
    return {} if content else None


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in ("get", "post", "put", "patch", "delete"):
                yield path, method.upper(), operation


@dataclass
class Tally:
    cases: int = 0
    failures: list[str] = field(default_factory=list)


def _real_read(world: World, schema: Any, path: str, ids: dict[str, Any], query: Any) -> None:
    """The operator's GET of a real row, checked against the schema like a fuzzed case (the
    fuzzing's random ids mostly meet 404s)."""
    operation = schema.find_operation_by_label(f"GET {path}")
    case = operation.Case(path_parameters=ids, query=query)
    response = case.call(base_url=world.base_url, headers=world.headers("operator"), timeout=30)
    case.validate_response(response, checks=CHECKS)


def _cross_tenant(world: World, document: dict[str, Any], schema: Any, tally: Tally) -> int:
    """Other operator's token on this operator's ids: 404 for every method. The customer on
    this operator's rows it may not see: never 2xx. The operator's own reads of them conform
    to the schema. Returns the operations checked."""
    checked = 0
    for path, method, operation in _operations(document):
        if "{" not in path:
            continue
        ids = _real_ids(world, path)
        if ids is None:
            tally.failures.append(f"{method} {path}: no real id found in {_collection_of(path)}")
            continue
        url = world.base_url + path.format(**ids)
        body = _request_example(operation)
        query = _required_query(operation)
        other = requests.request(
            method,
            url,
            headers=world.headers("other operator"),
            params=query,
            json=body,
            timeout=30,
        )
        tally.cases += 1
        checked += 1
        if other.status_code != 404:
            tally.failures.append(
                f"{method} {path} {ids}: another operator's token got {other.status_code}, not 404"
            )
        if method != "GET":
            continue
        own = requests.get(url, headers=world.headers("operator"), params=query, timeout=30)
        tally.cases += 1
        if own.status_code == 404:
            tally.failures.append(f"GET {path} {ids}: the operator's own id is 404")
        try:
            _real_read(world, schema, path, ids, query)
            tally.cases += 1
        except (Exception, BaseExceptionGroup) as failure:
            tally.failures.append(f"GET {path} {ids} as operator: {_summary(failure)}")
        names = _PARAM.findall(path)
        collection = _collection_of(path)
        visible = {
            tuple(_field(row, name) for name in names)
            for row in _list(world, "customer", collection)
        }
        hidden = [
            row
            for row in _list(world, "operator", collection)
            if tuple(_field(row, name) for name in names) not in visible
            and all(_field(row, name) is not None for name in names)
        ]
        if hidden:
            hidden_url = world.base_url + path.format(**{n: _field(hidden[0], n) for n in names})
            seen = requests.get(
                hidden_url, headers=world.headers("customer"), params=query, timeout=30
            )
            tally.cases += 1
            if seen.status_code < 300:
                tally.failures.append(
                    f"GET {path}: the customer read a row it does not list ({seen.status_code})"
                )
    return checked


def _fuzz(world: World, operation: Any, principal: str, tally: Tally) -> None:
    headers = world.headers(principal)

    @given(case=operation.as_strategy())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        response = case.call(base_url=world.base_url, headers=headers, timeout=30)
        tally.cases += 1
        case.validate_response(response, checks=CHECKS)

    try:
        run()
    # schemathesis reports a case's failed checks as one FailureGroup (an exception group).
    except (Exception, BaseExceptionGroup) as failure:
        tally.failures.append(f"{operation.label} as {principal}: {_summary(failure)}")


def _summary(failure: BaseException) -> str:
    lines = [line.strip() for line in str(failure).strip().splitlines() if line.strip()]
    return " | ".join(lines[:12])


def test_every_operation_against_the_live_server(world: World) -> None:
    started = time.monotonic()
    schema_url = f"{world.base_url}/api/v1/schema/?format=json"
    document = requests.get(schema_url, timeout=30).json()
    tally = Tally()
    schema = schemathesis.openapi.from_url(schema_url)
    cross_checked = _cross_tenant(world, document, schema, tally)

    operations = []
    for result in schema.get_all_operations():
        if isinstance(result, Ok):
            operations.append(result.ok())
        else:
            tally.failures.append(f"an operation schemathesis cannot read: {result.err()}")
    # Reads first: a fuzzed write (a revoke, a delete) then cannot take rows from them.
    operations.sort(key=lambda op: (op.method.upper() != "GET", op.label))
    for operation in operations:
        world.mint()
        for principal in ("operator", "customer", "other operator"):
            _fuzz(world, operation, principal, tally)
    elapsed = time.monotonic() - started
    print(
        f"\nschemathesis: {len(operations)} operations, {cross_checked} cross-tenant, "
        f"{tally.cases} cases, {MAX_EXAMPLES} examples per operation and principal, "
        f"{elapsed:.0f} s, {len(tally.failures)} failures"
    )
    assert len(operations) == sum(1 for _ in _operations(document))
    assert not tally.failures, "\n".join(tally.failures)
