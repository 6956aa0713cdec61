"""Batches for ingest tests, built through the agent's real encoder."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from contract import signals
from contract.wire.encode import BatchBuilder


def gpu_batch(
    agent_id: str = "agent-1",
    sequence: int = 1,
    *,
    node: str = "node-a",
    job: str | None = "job-1",
    gpus: int = 2,
    seconds: int = 10,
    start: float | None = None,
    names: tuple[str, ...] = (signals.DCGM_FI_DEV_GPU_UTIL, signals.DCGM_FI_DEV_POWER_USAGE),
    extra_records: list[dict[str, Any]] | None = None,
) -> Any:
    """`seconds` one-hertz samples of `names` on each of `gpus` GPUs of `node`; value =
    gpu_index * 1000 + second, so tests can check exactly what came back."""
    start = time.time() - seconds if start is None else start
    builder = BatchBuilder(agent_id)
    ts = start + np.arange(seconds, dtype=np.float64)
    for gpu_index in range(gpus):
        identity = {
            signals.NODE: node,
            signals.GPU: f"GPU-{node}-{gpu_index}",
            signals.GPU_INDEX: gpu_index,
        }
        if job:
            identity[signals.JOB] = job
            identity[signals.RANK] = gpu_index
        for k, name in enumerate(names):
            values = gpu_index * 1000 + k * 100 + np.arange(seconds, dtype=np.float64)
            builder.add_samples(name, identity, ts, values)
    for record in extra_records or []:
        builder.add(record)
    return builder.build(sequence)
