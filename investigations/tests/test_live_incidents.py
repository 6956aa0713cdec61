"""Incident merge/resolve and the exactly-once notification hook (investigations.services)."""

from __future__ import annotations

from typing import Any

import pytest

from investigations import notifications, services
from investigations.models import (
    Incident,
    IncidentState,
    NotificationKind,
    NotificationLog,
    ResolveReason,
    RevisionKind,
    VerdictRevision,
)
from investigations.tests.live_helpers import run_together, store_gpu_job, verdict
from tenants.context import system_context, tenant_context
from tenants.testing import Tenant, make_tenant

# Notifications fire on commit, so every test here commits for real.
pytestmark = pytest.mark.django_db(transaction=True)


def _job(tenant: Tenant, job: str = "job-1") -> int:
    return store_gpu_job(tenant.operator.pk, job, f"a-{job}")


def _merge(tenant: Tenant, verdicts: list[dict[str, Any]], end: float, **scope: Any) -> Any:
    with tenant_context(tenant.operator.pk):
        return services.merge_verdicts(tenant.operator.pk, verdicts, window_end=end, **scope)


def _incidents(tenant: Tenant) -> list[Incident]:
    with tenant_context(tenant.operator.pk):
        return list(Incident.objects.for_tenant(tenant.operator.pk).order_by("id"))


def test_lifecycle_create_update_category_change_resolve_and_recur(
    fired: list[notifications.Notification],
) -> None:
    a = make_tenant("inc-a")
    job = _job(a)
    # New verdict: one incident, revision 1, one "new" notification (after commit).
    _merge(a, [verdict(end=1_100)], 1_100, job_pk=job)
    [incident] = _incidents(a)
    assert (incident.state, incident.family, incident.revision) == ("open", "sequence_imbalance", 1)
    assert incident.verdict["id"] == str(incident.public_id)
    assert [(n.kind, n.family, n.category, n.job) for n in fired] == [
        ("new", "sequence_imbalance", "job", "job-1")
    ]
    # The same finding again, and a confidence wiggle: no revision, no notification.
    _merge(a, [verdict(end=1_100)], 1_110, job_pk=job)
    _merge(a, [verdict(end=1_120, confidence=0.82)], 1_120, job_pk=job)
    [incident] = _incidents(a)
    assert incident.revision == 1 and len(fired) == 1
    assert incident.last_seen.timestamp() == 1_120  # still seen: kept current
    # A substantial confidence change: a kept revision, still no notification.
    _merge(a, [verdict(end=1_130, confidence=0.95)], 1_130, job_pk=job)
    [incident] = _incidents(a)
    assert incident.revision == 2 and incident.confidence == 0.95 and len(fired) == 1
    # The category changes: revision + exactly one "changed" notification, even if repeated.
    for end in (1_140, 1_150):
        _merge(a, [verdict(category="infrastructure", end=end)], end, job_pk=job)
    [incident] = _incidents(a)
    assert incident.category == "infrastructure" and incident.revision == 3
    assert [(n.kind, n.category, n.previous_category) for n in fired[1:]] == [
        ("changed", "infrastructure", "job")
    ]
    # Absent for less than the grace period: open. For the grace period: resolved.
    _merge(a, [], 1_150 + services.GRACE_S - 1, job_pk=job)
    assert _incidents(a)[0].state == IncidentState.OPEN
    _merge(a, [], 1_150 + services.GRACE_S, job_pk=job)
    [incident] = _incidents(a)
    assert incident.state == IncidentState.RESOLVED
    assert incident.resolve_reason == ResolveReason.FINDING_ABSENT
    # The detectors still report the old occurrence inside their window: nothing reopens.
    _merge(a, [verdict(category="infrastructure", end=1_150)], 1_900, job_pk=job)
    assert len(_incidents(a)) == 1 and len(fired) == 2
    # A new occurrence later: a new incident and a "new" notification.
    _merge(a, [verdict(start=2_000, end=2_050)], 2_050, job_pk=job)
    incidents = _incidents(a)
    assert [i.state for i in incidents] == ["resolved", "open"]
    assert [n.kind for n in fired] == ["new", "changed", "new"]
    with tenant_context(a.operator.pk):
        kinds = list(
            VerdictRevision.objects.filter(incident=incidents[0]).values_list("kind", flat=True)
        )
    assert kinds == [
        RevisionKind.CREATED,
        RevisionKind.UPDATED,
        RevisionKind.CATEGORY_CHANGED,
        RevisionKind.RESOLVED,
    ]


def test_one_incident_per_family_and_job_end_resolves_all(
    fired: list[notifications.Notification],
) -> None:
    a = make_tenant("inc-b")
    job = _job(a)
    _merge(
        a,
        [
            verdict("checkpoint_stall", "infrastructure", confidence=0.7),
            verdict("checkpoint_stall", "infrastructure", confidence=0.9),
            verdict("numerical_divergence"),
        ],
        1_100,
        job_pk=job,
    )
    incidents = _incidents(a)
    assert sorted((i.family, i.confidence) for i in incidents) == [
        ("checkpoint_stall", 0.9),
        ("numerical_divergence", 0.8),
    ]
    assert len(fired) == 2
    _merge(a, [verdict("numerical_divergence", end=1_200)], 1_200, job_pk=job, ended=True)
    assert {(i.state, i.resolve_reason) for i in _incidents(a)} == {
        ("resolved", ResolveReason.JOB_ENDED)
    }


def test_gpu_degrading_is_one_incident_per_gpu_and_operator_only(
    fired: list[notifications.Notification],
) -> None:
    a = make_tenant("inc-c")
    for gpu in ("GPU-1", "GPU-2", "GPU-1"):
        _merge(a, [verdict("gpu_degrading", "infrastructure", job=None, gpu=gpu)], 1_100, gpu=gpu)
    incidents = _incidents(a)
    assert sorted(i.subject_gpu for i in incidents) == ["GPU-1", "GPU-2"]
    assert all(i.job_id is None for i in incidents)
    assert [n.job for n in fired] == [None, None]
    # A customer's principal sees no fleet-health incidents.
    principal = a.principal(a.customer_viewer)
    with tenant_context(a.operator.pk):
        assert not Incident.objects.for_tenant(principal).exists()


def test_notification_claimed_concurrently_fires_exactly_once(
    fired: list[notifications.Notification],
) -> None:
    a = make_tenant("inc-d")
    job = _job(a)
    _merge(a, [verdict()], 1_100, job_pk=job)
    assert len(fired) == 1
    [incident] = _incidents(a)
    with system_context():
        NotificationLog.objects.all().delete()  # as if the first claim had never happened
        revision = VerdictRevision.objects.get(incident=incident, number=1)
    fired.clear()
    claimed: list[bool] = []

    def claim(_: int) -> None:
        with tenant_context(a.operator.pk):
            claimed.append(notifications.record(incident, revision, NotificationKind.NEW))

    run_together(claim, 4)
    assert sorted(claimed) == [False, False, False, True]
    assert len(fired) == 1
    with tenant_context(a.operator.pk):
        assert NotificationLog.objects.for_tenant(a.operator.pk).count() == 1


def test_rolled_back_evaluation_notifies_nothing_and_its_retry_does(
    fired: list[notifications.Notification],
) -> None:
    a = make_tenant("inc-e")
    job = _job(a)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), tenant_context(a.operator.pk):
        services.merge_verdicts(a.operator.pk, [verdict()], window_end=1_100, job_pk=job)
        raise Boom
    assert fired == [] and _incidents(a) == []
    _merge(a, [verdict()], 1_100, job_pk=job)
    assert len(fired) == 1


def test_a_failing_subscriber_does_not_stop_the_others(
    fired: list[notifications.Notification],
) -> None:
    a = make_tenant("inc-f")
    job = _job(a)

    def broken(note: notifications.Notification) -> None:
        raise RuntimeError("chat is down")

    receiver = notifications.subscribe(broken)
    try:
        _merge(a, [verdict()], 1_100, job_pk=job)
    finally:
        notifications.unsubscribe(receiver)
    assert len(fired) == 1
