"""The investigation agent on live verdicts: each new revision enqueues its explanation after
commit (never a resolve, never a rolled-back one), and `explain_incident` stores the
investigation on the revision and the incident, for the incident's operator only."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import signals as celery_signals

from engine.tests.test_analyze import check_verdict
from investigations import explain_services, services
from investigations.models import Incident, ResolveReason, VerdictRevision
from investigations.tests.live_helpers import job_pk, store_gpu_job, store_sim, verdict
from investigator.model import LlamaCppWriter
from investigator.tools import CHECKS
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def published() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """(task name, args) of every task message Celery publishes meanwhile."""
    seen: list[tuple[str, tuple[Any, ...]]] = []

    def record(sender: Any = None, body: Any = None, headers: Any = None, **kw: Any) -> None:
        args = body[0] if isinstance(body, tuple | list) and body else ()
        seen.append((str((headers or {}).get("task") or sender), tuple(args)))

    celery_signals.before_task_publish.connect(record, weak=False)
    try:
        yield seen
    finally:
        celery_signals.before_task_publish.disconnect(record)


def _explains(seen: list[tuple[str, tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    return [args for name, args in seen if name == "investigations.explain_verdict"]


def test_each_new_revision_enqueues_its_explanation_after_commit(
    settings: Any, published: list[tuple[str, tuple[Any, ...]]]
) -> None:
    settings.PROOF_EXPLAIN = True
    a = make_tenant("explain-a")
    op = a.operator.pk
    job = store_gpu_job(op, "job-1", "a-job-1")
    with tenant_context(op):
        services.merge_verdicts(op, [verdict(end=1_100)], window_end=1_100, job_pk=job)
        assert _explains(published) == []  # not before the commit
    with tenant_context(op):
        incident = Incident.objects.for_tenant(op).get()
    assert _explains(published) == [(op, incident.pk, 1)]
    # a material change: revision 2, explained too; the same evidence again: nothing
    with tenant_context(op):
        services.merge_verdicts(
            op, [verdict(end=1_200, confidence=0.99)], window_end=1_200, job_pk=job
        )
        services.merge_verdicts(
            op, [verdict(end=1_200, confidence=0.99)], window_end=1_200, job_pk=job
        )
    assert _explains(published) == [(op, incident.pk, 1), (op, incident.pk, 2)]
    # a rolled-back revision and a resolve enqueue nothing
    with pytest.raises(RuntimeError), tenant_context(op):
        services.merge_verdicts(
            op, [verdict(end=1_300, confidence=0.5)], window_end=1_300, job_pk=job
        )
        raise RuntimeError("roll back")
    with tenant_context(op):
        services.resolve_incident(
            Incident.objects.for_tenant(op).get(), ResolveReason.JOB_ENDED, 1_300
        )
    assert len(_explains(published)) == 2
    settings.PROOF_EXPLAIN = False
    with tenant_context(op):
        services.merge_verdicts(op, [verdict(end=9_000)], window_end=9_000, job_pk=job)
    assert len(_explains(published)) == 2


@pytest.mark.slow
def test_a_live_slow_rank_verdict_gets_its_investigation_stored() -> None:
    a = make_tenant("explain-live-a")
    b = make_tenant("explain-live-b")
    op = a.operator.pk
    sim = store_sim(op, "slow_rank", duration_s=300, nodes=2, gpus_per_node=4, seed=0)
    pk = job_pk(op, sim.jobs[0])
    result = services.evaluate_job(op, pk)
    assert "slow_rank" in {v["family"] for v in result.verdicts}
    with tenant_context(op):
        incident = Incident.objects.for_tenant(op).get(family="slow_rank")
    # another operator cannot explain (or even find) this incident
    assert explain_services.explain_incident(b.operator.pk, incident.pk, incident.revision) == (
        "missing"
    )
    status = explain_services.explain_incident(
        op, incident.pk, incident.revision, writer=LlamaCppWriter()
    )
    assert status in ("explained", "fallback")
    with tenant_context(op):
        incident.refresh_from_db()
        revision = VerdictRevision.objects.for_tenant(op).get(
            incident=incident, number=incident.revision
        )
    inv = incident.verdict["investigation"]
    assert [s["check"] for s in inv["steps"]] == list(CHECKS)
    # the stored verdict, investigation included, is the contract's (verdict_schema.json)
    check_verdict(incident.verdict)
    check_verdict(revision.verdict)
    assert inv["validated"] == (status == "explained") and inv["fallback"] == (status == "fallback")
    assert revision.verdict["investigation"] == inv
    assert revision.verdict["explanation"] == incident.verdict["explanation"]
    # a stale revision is not explained again
    assert explain_services.explain_incident(op, incident.pk, incident.revision + 1) == "missing"
    # the next evaluation, with no material change, keeps the investigation on the incident
    services.evaluate_job(op, pk)
    with tenant_context(op):
        incident.refresh_from_db()
    if incident.revision == revision.number:
        assert incident.verdict["investigation"] == inv
