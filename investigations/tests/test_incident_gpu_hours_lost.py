"""Incident.gpu_hours_lost, the stored generated column the price page sums: the verdict's
impact.gpu_hours_lost where it is a JSON number, NULL otherwise (none stated, null, a string),
kept by the database through every kind of write."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from investigations.models import Incident
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def _incident(op: int, gpu: str, verdict: dict[str, Any]) -> Incident:
    now = datetime.now(UTC)
    return Incident.objects.create(
        operator_id=op,
        family="gpu_degrading",
        category="infrastructure",
        confidence=0.9,
        subject_gpu=gpu,
        first_seen=now,
        last_seen=now,
        verdict=verdict,
    )


def test_the_column_follows_the_verdict_and_is_null_for_anything_but_a_number() -> None:
    op = make_tenant("lost-a").operator.pk
    with tenant_context(op):
        stated = _incident(op, "GPU-1", {"impact": {"gpu_hours_lost": 2.5}})
        whole = _incident(op, "GPU-2", {"impact": {"gpu_hours_lost": 3}})
        unstated = _incident(op, "GPU-3", {"impact": {"slowdown_pct": 10}})
        null = _incident(op, "GPU-4", {"impact": {"gpu_hours_lost": None}})
        text = _incident(op, "GPU-5", {"impact": {"gpu_hours_lost": "lots"}})
        none = _incident(op, "GPU-6", {})
        lost = dict(Incident.objects.for_tenant(op).values_list("subject_gpu", "gpu_hours_lost"))
        assert lost == {
            "GPU-1": 2.5,
            "GPU-2": 3.0,
            "GPU-3": None,
            "GPU-4": None,
            "GPU-5": None,
            "GPU-6": None,
        }
        # A revision rewrites the verdict: by save() and by a queryset update alike.
        stated.verdict = {"impact": {"gpu_hours_lost": 7.25}}
        stated.save()
        Incident.objects.filter(pk=unstated.pk).update(verdict={"impact": {"gpu_hours_lost": 1}})
        stated.refresh_from_db()
        unstated.refresh_from_db()
        assert (stated.gpu_hours_lost, unstated.gpu_hours_lost) == (7.25, 1.0)
        assert whole.pk and null.pk and text.pk and none.pk
