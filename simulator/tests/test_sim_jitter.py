"""Healthy simulated jobs carry realistic per-rank per-step compute jitter (a few percent), so
the detectors' materiality floor is exercised by the healthy controls."""

from __future__ import annotations

import numpy as np

from simulator.job import COMPUTE_JITTER_MAX, COMPUTE_JITTER_MIN, JobPlan, JobResult
from simulator.scenarios import ScenarioContext
from simulator.training_scenarios import _Setup


def _healthy_job(seed: int, nodes: int = 2, gpn: int = 4) -> tuple[JobPlan, JobResult]:
    ctx = ScenarioContext(
        scenario="healthy_training",
        seed=seed,
        rng=np.random.default_rng(seed),
        duration_s=300.0,
        nodes=nodes,
        gpus_per_node=gpn,
        start_ts=1_767_600_000.0,
    )
    s = _Setup(ctx, neighbor_ok=False)
    plan = s.plan(start_frac=0.01)
    return plan, s.simulate(plan)


def test_healthy_ranks_jitter_a_few_percent_step_to_step() -> None:
    sds = []
    for seed in range(4):
        plan, res = _healthy_job(seed)
        assert COMPUTE_JITTER_MIN <= plan.compute_jitter <= COMPUTE_JITTER_MAX
        ok = np.isfinite(res.arrive).all(axis=0)
        compute = (res.arrive - res.compute_start)[:, ok]
        assert compute.shape[1] >= 20
        # Relative deviation of each rank from the step's median rank, step by step.
        rel = compute / np.median(compute, axis=0, keepdims=True) - 1.0
        sd = float(np.std(rel))
        sds.append(sd)
        # The measured jitter is the drawn one (within sampling error and the clock
        # differences between GPUs).
        assert 0.6 * plan.compute_jitter < sd < 1.6 * plan.compute_jitter + 0.01
        # …and it makes the ranks wait for the slowest one every step: a few percent.
        wait = float(np.mean((compute.max(axis=0) - compute) / compute.max(axis=0)))
        assert 0.01 < wait < 0.12
    assert max(sds) > 0.015  # not the near-perfect lockstep of before (0.8%)
