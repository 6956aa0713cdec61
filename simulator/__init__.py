"""Simulated GPU hardware and the jobs running on it (docs/design.md §1, §3–§6).

    run = simulate("slow_rank", seed=7, duration_s=1800)
    run.meta["truth"]      # {"family": "slow_rank", "category": ..., "subject": {...}, "onset": ts}
    run.write("t.jsonl.gz")  # trace format v1, vectorised
    for record in run.records(): ...

See docs/simulator.md for the model, the scenarios and their ground truth.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from simulator.run import WITHHOLDABLE, SimRun
from simulator.scenarios import ScenarioContext, ScenarioInfo, UnknownScenario, get, list_scenarios

__all__ = [
    "ScenarioContext",
    "ScenarioInfo",
    "SimRun",
    "UnknownScenario",
    "list_scenarios",
    "simulate",
]

# 2026-01-05 00:00:00 UTC: default traces start on a Monday in early 2026, shifted by the seed.
_DEFAULT_EPOCH = 1767571200.0


def _job_roles(run: SimRun) -> dict[str, str]:
    """{job id: role} for a builder that did not say: the truth's job (else the first job seen)
    is the "primary" one the scenario is about; any other is "other"."""
    ids: list[str] = []
    for rec in run.discrete:
        if rec["type"] == "job" and rec["job"] not in ids:
            ids.append(rec["job"])
    truth = run.meta.get("truth") or {}
    subject_job = (truth.get("subject") or {}).get("job") if isinstance(truth, dict) else None
    primary = subject_job if subject_job in ids else (ids[0] if ids else None)
    return {j: "primary" if j == primary else "other" for j in ids}


def simulate(
    scenario: str,
    *,
    seed: int,
    duration_s: float,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    start_ts: float | None = None,
    without: Sequence[str] = (),
) -> SimRun:
    """Build the trace of `scenario`; the same arguments always give the same trace.

    `without` names sources the recording agent could not read (`run.WITHHOLDABLE`: "ebpf",
    "dcgm_prof", "logs", "ib", "storage", "kernel_log"); their records are left out and
    `meta.missing_sources` lists them.
    """
    info, builder = get(scenario)
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    if nodes is not None and nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    if gpus_per_node is not None and not 1 <= gpus_per_node <= 16:
        raise ValueError(f"gpus_per_node must be 1..16, got {gpus_per_node}")
    rng = np.random.default_rng([seed, zlib.crc32(scenario.encode())])
    if start_ts is None:
        start_ts = _DEFAULT_EPOCH + (seed % 365) * 86400.0 + float(rng.integers(0, 86400))
    ctx = ScenarioContext(
        scenario=scenario,
        seed=seed,
        rng=rng,
        duration_s=float(duration_s),
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        start_ts=float(start_ts),
    )
    if without:
        bad = [src for src in without if src not in WITHHOLDABLE]
        if bad:
            raise ValueError(f"unknown source(s) {bad}; known: {sorted(WITHHOLDABLE)}")
    run = builder(ctx)
    if without:
        run.withhold(list(without))
    # Every simulated trace's meta says what produced it and the window it covers.
    for key, value in (
        ("source", "proof-sim"),
        ("scenario", info.name),
        ("kind", info.kind),
        ("seed", seed),
        ("duration_s", float(duration_s)),
        ("start_ts", float(start_ts)),
        ("interval_s", ctx.interval_s),
    ):
        run.meta.setdefault(key, value)
    if "jobs" not in run.meta:
        run.meta["jobs"] = _job_roles(run)
    return run
