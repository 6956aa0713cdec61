"""The operator's chargeback per customer and month from investigations' accounted GPU time
(docs/pricing.md): GPUs, GPU-hours, productive share, list cost and real price per productive
GPU-hour; usage straddling the month counted pro rata; another operator's never; a customer
principal sees none; the CSV."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from billing import selectors
from ingest.models import Job
from investigations.models import GpuListPrice, JobGpuUsage
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)

FEB = date(2028, 2, 1)
MODEL = "NVIDIA H100 80GB HBM3"


def _usage(op: int, job: Job, gpu: str, start: datetime, hours: float, compute: float) -> None:
    t0 = start.timestamp()
    JobGpuUsage.objects.create(
        operator_id=op,
        job=job,
        gpu=gpu,
        node="n1",
        gpu_model=MODEL,
        gpu_seconds=hours * 3600,
        compute_seconds=compute * hours * 3600,
        wait_seconds=0.0,
        idle_seconds=(1 - compute) * hours * 3600,
        first_ts=t0,
        last_ts=t0 + hours * 3600,
        method="engine+ebpf",
    )


def test_chargeback_per_customer_and_month() -> None:
    a = make_tenant("cb-a")
    b = make_tenant("cb-b")
    op = a.operator.pk
    second = tenant_services.do_create_customer(op, name="Second team", slug="second")
    when = datetime(2028, 2, 10, tzinfo=UTC)
    with tenant_context(op):
        GpuListPrice.objects.create(
            operator_id=op, gpu_model=MODEL, price_per_gpu_hour=Decimal("2")
        )
        j1 = Job.objects.create(
            operator_id=op, job_id="j1", customer=a.customer, first_seen_at=when, last_seen_at=when
        )
        j2 = Job.objects.create(
            operator_id=op, job_id="j2", customer=second, first_seen_at=when, last_seen_at=when
        )
        for g in ("G1", "G2"):
            _usage(op, j1, g, when, 10.0, 0.5)  # 20 GPU-hours, half productive
        _usage(op, j2, "G3", when, 4.0, 1.0)
        # Straddles Feb → Mar: 12 h in February of its 24 h.
        _usage(op, j2, "G4", datetime(2028, 2, 29, 12, tzinfo=UTC), 24.0, 1.0)
    with tenant_context(b.operator.pk):
        jb = Job.objects.create(
            operator_id=b.operator.pk,
            job_id="jb",
            customer=b.customer,
            first_seen_at=when,
            last_seen_at=when,
        )
        _usage(b.operator.pk, jb, "GB", when, 100.0, 1.0)

    rows = {r.customer: r for r in selectors.chargeback(a.principal(a.operator_admin), FEB)}
    assert set(rows) == {a.customer.name, "Second team"}
    first = rows[a.customer.name]
    assert (first.gpus, first.gpu_hours, first.productive_share) == (2, 20.0, 0.5)
    assert first.list_cost == Decimal("40.00") and first.effective_price == Decimal("4.00")
    other = rows["Second team"]
    assert other.gpus == 2 and other.gpu_hours == pytest.approx(16.0)
    assert selectors.chargeback(a.principal(a.customer_admin), FEB) == []
    csv = selectors.chargeback_csv(a.principal(a.operator_admin), FEB).splitlines()
    assert csv[0].split(",")[:3] == ["month", "customer", "gpus"]
    assert any(line.startswith(f"2028-02,{a.customer.name},2,20.0000,0.5000,40.00") for line in csv)
    assert len(csv) == 3
