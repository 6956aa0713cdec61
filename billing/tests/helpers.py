"""Stored data for billing's tests: hourly rollups of GPU series (what metering reads), the
way ingest's rollup task leaves them, written directly for days ingest would no longer accept
(February 2028, last month), and real batches through ingest for the recent past."""

from __future__ import annotations

from datetime import date, timedelta

import numpy as np

from billing.bench import MODEL, rollups
from contract import signals
from contract.wire.encode import BatchBuilder
from ingest import services as ingest_services
from ingest.processing import Limits, decode_batch

HOUR_MS = 3_600_000
__all__ = ["days_of", "rollups", "stream"]


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
