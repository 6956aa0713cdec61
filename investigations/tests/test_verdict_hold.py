"""Holding an operator's verdicts (investigations/verdict_hold.py): while held, evaluations
account GPU time and merge nothing; on release the held period is evaluated and its verdict
published, once; another operator is never held."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from investigations import notifications, services, verdict_hold
from investigations.models import Incident, JobGpuUsage, VerdictHold
from investigations.tests.live_helpers import job_pk, store_sim
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def test_held_verdicts_are_computed_on_release_and_usage_never_stops(
    fired: list[notifications.Notification],
) -> None:
    a = make_tenant("hold-a")
    b = make_tenant("hold-b")
    op = a.operator.pk
    held_since = datetime.fromtimestamp(datetime.now(UTC).timestamp() - 3600, UTC)
    verdict_hold.do_hold_verdicts(op, "invoice unpaid past the grace period", now=held_since)
    # Idempotent: a second hold keeps the first one's start.
    again = verdict_hold.do_hold_verdicts(op, "still unpaid")
    assert again.held_since == held_since and again.reason == "still unpaid"

    sim = store_sim(op, "sequence_imbalance")
    job = job_pk(op, sim.jobs[0])
    other = store_sim(b.operator.pk, "sequence_imbalance", agent_id="hold-b-agent")
    other_job = job_pk(b.operator.pk, other.jobs[0])

    result = services.evaluate_job(op, job)
    assert result.status == "evaluated" and result.verdicts  # detected...
    with tenant_context(op):
        assert not Incident.objects.for_tenant(op).exists()  # ...but nothing published
        assert JobGpuUsage.objects.for_tenant(op).filter(job_id=job).count() == 4
    assert not [n for n in fired if n.operator_id == op]
    # The other operator is not held.
    services.evaluate_job(b.operator.pk, other_job)
    with tenant_context(b.operator.pk):
        assert Incident.objects.for_tenant(b.operator.pk).count() == 1

    released = verdict_hold.do_release_verdicts(op)
    assert released is not None and released.jobs >= 1 and released.incidents_created == 1
    with tenant_context(op):
        assert not VerdictHold.objects.for_tenant(op).exists()
        [incident] = Incident.objects.for_tenant(op).filter(job_id=job)
    assert incident.family == "sequence_imbalance"
    assert [(n.family, n.kind) for n in fired if n.operator_id == op] == [
        ("sequence_imbalance", "new")
    ]
    # Live again: evaluating merges into the same incident, notifies nothing new.
    services.evaluate_job(op, job)
    assert len([n for n in fired if n.operator_id == op]) == 1
    assert verdict_hold.do_release_verdicts(op) is None


def test_windows_cover_the_held_period_in_order() -> None:
    spans = verdict_hold._windows(first=0.0, last=5000.0, since=1000.0)
    assert spans[0] == (1000.0, 2800.0)
    assert spans[-1] == (3200.0, 5000.0)
    assert all(b[1] > a[1] for a, b in itertools.pairwise(spans))
    # A job younger than a window is seen once, from its first data.
    assert verdict_hold._windows(first=100.0, last=400.0, since=0.0) == [(100.0, 400.0)]
