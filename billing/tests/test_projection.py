"""This month's projection on the demo's plan: GPUs reporting now count before their hour's
rollup exists (the inventory's last_seen_at), carried to the month's end and priced with the
plan's tiers and minimum; the demo plan is assigned once."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from decimal import Decimal

import numpy as np
import pytest

from billing import selectors, services
from billing.pricing import days_in_month
from contract import signals
from contract.wire.encode import BatchBuilder
from ingest import services as ingest_services
from ingest.processing import Limits, decode_batch
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_plan_projection_counts_gpus_reporting_now() -> None:
    a = make_tenant("proj-a")
    op = a.operator.pk
    first = services.ensure_demo_plan(op)
    assert services.ensure_demo_plan(op).pk == first.pk
    builder = BatchBuilder("proj-agent")
    now = time.time()
    for k in range(30):  # 30 GPUs streaming, no rollup built yet
        identity = {signals.NODE: f"n{k // 8}", signals.GPU: f"GPU-P{k}", signals.GPU_INDEX: k % 8}
        builder.add_samples(
            signals.DCGM_FI_DEV_GPU_UTIL, identity, np.array([now - 5.0, now - 4.0]), np.ones(2)
        )
    ingest_services.store_batch(op, decode_batch(builder.build(1), Limits()))
    proj = selectors.projection(op)
    assert proj.gpus_today == 30
    today = datetime.now(UTC).date()
    remaining = days_in_month(today) - today.day + 1
    months = Decimal(30 * remaining) / Decimal(days_in_month(today))
    tiered = min(months, Decimal(100)) * 45 + max(months - 100, Decimal(0)) * 35
    expected = max(tiered.quantize(Decimal("0.01")), Decimal("500.00"))
    assert abs(proj.projected.total - expected) <= Decimal("0.02")
    assert proj.priced.gpu_days == 0  # nothing metered yet: today is not over
