"""Stored data for billing's tests: hourly rollups of GPU series (what metering reads), the
way ingest's rollup task leaves them, written directly for days ingest would no longer accept
(February 2028, last month), and real batches through ingest for the recent past."""

from __future__ import annotations

import hashlib
from datetime import UTC, date, datetime, time, timedelta

import numpy as np

from contract import signals
from contract.wire.encode import BatchBuilder
from ingest import services as ingest_services
from ingest.models import Gpu, Node, Series, SeriesRollup
from ingest.processing import Limits, decode_batch
from tenants.context import tenant_context

HOUR_MS = 3_600_000
MODEL = "NVIDIA H100 80GB HBM3"


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
                start = int(datetime.combine(day, time(0), UTC).timestamp() * 1000)
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


def stream(
    operator_id: int, agent_id: str, hostname: str, gpu: str, start: float, seconds: int = 20
) -> None:
    """An agent on `hostname` registers and streams `seconds` of one GPU's samples from `start`,
    then the hours it touched are rolled up, as ingest's task does."""
    ingest_services.register_agent(
        operator_id,
        agent_id=agent_id,
        hostname=hostname,
        agent_version="test",
        gpus=[{"uuid": gpu, "index": 0, "model": MODEL}],
    )
    builder = BatchBuilder(agent_id)
    ts = start + np.arange(seconds, dtype=np.float64)
    identity = {signals.NODE: hostname, signals.GPU: gpu, signals.GPU_INDEX: 0}
    builder.add_samples(signals.DCGM_FI_DEV_GPU_UTIL, identity, ts, np.full(seconds, 50.0))
    ingest_services.store_batch(operator_id, decode_batch(builder.build(1), Limits()))
    hour = int(start * 1000) // HOUR_MS * HOUR_MS
    for k in range(2):
        ingest_services.build_rollups(operator_id, hour + k * HOUR_MS)


def days_of(month: date) -> list[date]:
    nxt = date(month.year + (month.month == 12), month.month % 12 + 1, 1)
    return [month + timedelta(days=k) for k in range((nxt - month).days)]
