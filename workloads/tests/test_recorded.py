"""Real programs recorded with `proof-agent exec --out`, judged by `proof analyze --json`.

Every test first checks the premise — the fault really happened (or did not) in what the
program printed — and then what Proof said: a healthy run gets no verdict, a faulty one its
family, and every run is seen as a job with its ranks, state and steps (the top-level
"jobs" list of `proof analyze --json`).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from contract.trace import validate_trace
from workloads.harness import Run, job_field

pytestmark = pytest.mark.workload


def only_job(run: Run) -> dict[str, Any]:
    """The run's one job in `proof analyze --json`'s "jobs" list."""
    jobs = run.jobs
    assert jobs is not None, f'`proof analyze --json` printed no "jobs" list: {run.describe()}'
    assert len(jobs) == 1, f"expected one job, Proof saw {jobs}"
    return jobs[0]


def last_step(job: dict[str, Any]) -> int | None:
    steps = job_field(job, "steps")
    if isinstance(steps, dict):
        last = steps.get("last")
        return int(last) if last is not None else None
    return None


# --- Hugging Face Trainer ---------------------------------------------------------------------


def test_hf_trainer_healthy_gets_no_verdict(hf_healthy: Run) -> None:
    run = hf_healthy
    assert run.rc == 0, run.describe()
    losses = run.losses()
    # The premise: it learned (ln(vocab) ≈ 3.3 down past 1.2), saving at steps 100/200/300
    # with the Trainer's real "Writing model shards" bars and string-valued metric dicts.
    assert len(losses) >= 25 and losses[0] > 2.5 and min(losses[-6:]) < 1.2, losses
    assert run.output_has("Writing model shards") and run.output_has("'loss': '")
    assert run.families == [], run.describe()
    job = only_job(run)
    assert job_field(job, "state") == "completed", job
    assert last_step(job) == 300, job


def test_hf_trainer_lr_zero_is_no_learning(hf_lr0: Run) -> None:
    run = hf_lr0
    assert run.rc == 0, run.describe()
    losses = run.losses()
    assert run.output_has("'learning_rate': '0'")
    assert len(losses) >= 25 and max(losses) - min(losses) < 0.1, losses  # flat: nothing learned
    assert run.families == ["no_learning"], run.describe()
    assert job_field(only_job(run), "state") == "completed"


def test_hf_trainer_exploding_lr_is_divergence_not_no_learning(hf_exploding: Run) -> None:
    run = hf_exploding
    assert run.rc == 0, run.describe()
    losses = [x for x in run.losses() if math.isfinite(x)]
    # The premise: the loss climbed by orders of magnitude (warm-up to lr 4, no clipping).
    assert len(losses) >= 10 and max(losses) >= 100 * losses[0], losses
    assert run.families == ["numerical_divergence"], run.describe()
    only_job(run)


def test_hf_trainer_nan_mid_run_is_divergence_not_a_perfect_loss(hf_nan: Run) -> None:
    """After a weight turns NaN the Trainer logs `'grad_norm': 'nan'` and, its NaN filter
    on, `'loss': '0'`: a loss of 0 here is not a run that learned perfectly."""
    run = hf_nan
    assert run.rc == 0, run.describe()
    assert run.output_has("'grad_norm': 'nan'") and run.output_has("'loss': '0'")
    assert run.families == ["numerical_divergence"], run.describe()
    only_job(run)


# --- Lightning --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "printed", "families"),
    [
        (
            "lightning_healthy",
            ("`Trainer.fit` stopped: `max_epochs=1` reached.", "train_loss="),
            [],
        ),
        # Lightning's default bar when rich is installed prints only its last frame outside a
        # terminal: Proof sees the job, not a loss history, and must blame nothing.
        ("lightning_rich_healthy", ("train_loss:",), []),
        ("lightning_lr0", ("train_loss=",), ["no_learning"]),
    ],
)
def test_lightning_run_completes_with_the_expected_families(
    fixture: str, printed: tuple[str, ...], families: list[str], request: pytest.FixtureRequest
) -> None:
    run: Run = request.getfixturevalue(fixture)
    assert run.rc == 0, run.describe()
    for line in printed:
        assert run.output_has(line), line
    assert run.families == families, run.describe()
    assert job_field(only_job(run), "state") == "completed"


# --- plain torch loop -------------------------------------------------------------------------


def test_torch_loop_healthy_gets_no_verdict(torch_healthy: Run) -> None:
    run = torch_healthy
    assert run.rc == 0, run.describe()
    losses = run.losses()
    assert len(losses) == 30 and losses[0] > 2.0 and losses[-1] < 0.6, losses
    assert run.families == [], run.describe()
    job = only_job(run)
    assert job_field(job, "state") == "completed" and last_step(job) == 300, job


def test_torch_loop_nan_mid_run_is_divergence_at_that_step(torch_nan: Run) -> None:
    run = torch_nan
    assert run.rc == 0, run.describe()
    losses = run.losses()
    # The premise: finite and falling until the poisoned step, NaN from step 150 on.
    assert all(math.isfinite(x) for x in losses[:14]) and losses[13] < losses[0], losses
    assert all(math.isnan(x) for x in losses[14:]), losses
    assert run.families == ["numerical_divergence"], run.describe()
    verdict = run.analysis.verdicts[0] if run.analysis else {}
    assert "step 150" in verdict["summary"], verdict["summary"]


# --- torchrun, 2 gloo ranks -------------------------------------------------------------------


def test_torchrun_two_ranks_healthy_is_one_job_with_both_ranks(ddp_healthy: Run) -> None:
    run = ddp_healthy
    assert run.rc == 0, run.describe()
    assert run.output_has("ddp: world size 2, backend gloo")
    assert run.output_has("training completed: 200 steps on 2 ranks")
    assert run.families == [], run.describe()
    job = only_job(run)
    assert sorted(job_field(job, "ranks") or []) == [0, 1], job
    assert job_field(job, "state") == "completed", job
    assert job_field(job, "world_size") == 2, job


def test_torchrun_four_ranks_healthy(ddp4_healthy: Run) -> None:
    run = ddp4_healthy
    assert run.rc == 0, run.describe()
    assert run.output_has("training completed: 100 steps on 4 ranks")
    assert run.families == [], run.describe()
    job = only_job(run)
    assert sorted(job_field(job, "ranks") or []) == [0, 1, 2, 3], job
    assert job_field(job, "world_size") == 4 and job_field(job, "state") == "completed", job


def test_torchrun_rank_that_never_reaches_the_all_reduce(ddp_rank_stops: Run) -> None:
    """Gloo on CPU: rank 1 stops before step 100's all-reduce; rank 0 times out after 20 s
    and torchrun tears the job down. Without a GPU there are no kernel launches or tensor
    activity to watch, so `collective_hang` is read from gloo's own timeout line (torch
    prefixes the worker's traceback with `[rank0]:`): rank 1, the one rank of 2 that did not
    time out, never arrived."""
    run = ddp_rank_stops
    assert run.rc != 0, run.describe()
    assert run.output_has("rank 1: stopping before the all-reduce of step 100")
    gloo = "Timed out waiting 20000ms for recv operation to complete"
    assert run.output_has(gloo), run.describe()
    assert any(gloo in r["line"] for r in run.logs()), "the gloo timeout line was not recorded"
    assert run.families == ["collective_hang"], run.describe()
    for v in run.analysis.verdicts if run.analysis else []:
        assert v["subject"]["rank"] == 1, v
        assert "timed out after 20 s waiting in a recv operation" in v["summary"], v
    job = only_job(run)
    assert sorted(job_field(job, "ranks") or []) == [0, 1], job
    assert job_field(job, "state") == "failed", job


# --- every recorded trace ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "fixture",
    [
        "hf_healthy",
        "hf_lr0",
        "hf_exploding",
        "hf_nan",
        "lightning_healthy",
        "lightning_rich_healthy",
        "lightning_lr0",
        "torch_healthy",
        "torch_nan",
        "ddp_healthy",
        "ddp4_healthy",
        "ddp_rank_stops",
    ],
)
def test_recorded_trace_is_valid_v1(fixture: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(fixture)
    assert run.trace is not None, run.describe()
    report = validate_trace(run.trace)
    assert report.ok, (run.name, report)
    assert report.counts.get("log", 0) >= 10 and report.counts.get("exit", 0) >= 1, report.counts
    assert run.analysis is not None and run.analysis.rc == 0, run.describe()
