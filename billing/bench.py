"""`proof billing bench`: the daily usage computation's cost on a synthetic fleet — rollups
of `gpus` GPUs (one GPU series each, every hour of each day) over `days` days of a month,
then metering those days from them, as the hourly task does, timed. Writes into the database
the settings name, under its own operator (slug "bench-billing"), and removes that operator's
billing rows first so each run meters from scratch."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock

from django.db import transaction

from billing import metering
from billing.models import DailyUsage, MeterReport
from contract import signals
from ingest import selectors as ingest_selectors
from ingest.models import Gpu, Node, Series, SeriesRollup
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.selectors import operator_by_slug

SLUG = "bench-billing"
HOUR_MS = 3_600_000
MODEL = "NVIDIA H100 80GB HBM3"


# Synthetic data writes ingest's rollup rows directly, as its rollup task leaves them: ingest
# has no service that makes rollups without the samples behind them, and a month of samples
# for a 1,000-GPU fleet would take the bench hours to store. Billing's tests use it too.
def rollups(
    operator_id: int, gpus_by_node: dict[str, list[str]], days: list[date], hours: int = 1
) -> int:
    """One rollup bucket of one GPU series per GPU per hour for `hours` hours of each day."""
    made = 0
    with tenant_context(operator_id):
        for hostname, gpus in gpus_by_node.items():
            node, _ = Node.objects.get_or_create(operator_id=operator_id, hostname=hostname)
            series = []
            for uuid in gpus:
                Gpu.objects.update_or_create(
                    operator_id=operator_id, uuid=uuid, defaults={"node": node, "model": MODEL}
                )
                key = hashlib.sha256(f"{hostname}/{uuid}".encode()).hexdigest()[:32]
                s, _ = Series.objects.get_or_create(
                    operator_id=operator_id,
                    key_hash=key,
                    defaults={"name": signals.DCGM_FI_DEV_GPU_UTIL, "node": node, "gpu": uuid},
                )
                series.append(s)
            rows = []
            for day in days:
                start = int(datetime.combine(day, clock(0), UTC).timestamp() * 1000)
                for h in range(hours):
                    for s in series:
                        rows.append(
                            SeriesRollup(
                                operator_id=operator_id,
                                series=s,
                                bucket_start_ms=start + h * HOUR_MS,
                                count=60,
                                min=0.0,
                                max=1.0,
                                sum=30.0,
                                first=0.0,
                                last=1.0,
                            )
                        )
            SeriesRollup.objects.bulk_create(rows, batch_size=5000)
            made += len(rows)
    return made


@dataclass(frozen=True)
class BenchResult:
    gpus: int
    days: int
    rollup_rows: int
    usage_rows: int
    seconds: float

    def lines(self) -> list[str]:
        return [
            f"fleet: {self.gpus} GPUs × {self.days} days ({self.rollup_rows} hourly rollup rows read)",
            f"metering: {self.usage_rows} daily usage rows + {self.days} meter reports in "
            f"{self.seconds:.2f} s ({1000 * self.seconds / self.days:.0f} ms per day of the fleet)",
        ]


def run_bench(gpus: int, days: int, month: date, hours: int = 24) -> BenchResult:
    operator = operator_by_slug(SLUG)
    if operator is None:
        operator, _admin = tenant_services.do_create_operator(
            name="Billing bench",
            slug=SLUG,
            admin_username=f"{SLUG}-admin",
            admin_email="",
            admin_password=secrets.token_urlsafe(16),
        )
    op = int(operator.pk)
    day_list = [month + timedelta(days=k) for k in range(days)]
    with transaction.atomic(), tenant_context(op):
        DailyUsage.objects.for_tenant(op).delete()
        MeterReport.objects.for_tenant(op).delete()
    made = 0
    have = ingest_selectors.gpus_reported_between(op, *metering.day_bounds_ms(day_list[0]))
    if len(have) < gpus:
        per_node = 8
        nodes = {
            f"bench-node-{n:04d}": [f"GPU-bench-{n:04d}-{g}" for g in range(per_node)]
            for n in range(gpus // per_node)
        }
        made = rollups(op, nodes, day_list, hours=hours)
    started = time.perf_counter()
    results = metering.do_meter_range(op, day_list[0], day_list[-1])
    seconds = time.perf_counter() - started
    return BenchResult(
        gpus, days, made or gpus * days * hours, sum(r.new_rows for r in results), seconds
    )
