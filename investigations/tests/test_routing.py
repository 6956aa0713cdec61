"""Each job's evaluations go to one queue of PROOF_EVAL_QUEUES (investigations/routing.py)."""

from __future__ import annotations

from typing import Any

from investigations.routing import EVALUATE_JOB, eval_queue, route_task


def test_a_jobs_evaluations_always_go_to_its_one_queue(settings: Any) -> None:
    settings.PROOF_EVAL_QUEUES = 4
    routed = {
        str((route_task(EVALUATE_JOB, [7, pk], {}, {}) or {}).get("queue")) for pk in range(200)
    }
    assert routed == {f"proof.eval.{k}" for k in range(4)}  # spread over every queue
    # The same job, however it is sent, in any process (crc32, not the salted hash()).
    assert route_task(EVALUATE_JOB, [7, 42], {}, {}) == {"queue": eval_queue(7, 42, 4)}
    assert route_task(EVALUATE_JOB, [], {"operator_id": 7, "job_id": 42}, {}) == {
        "queue": eval_queue(7, 42, 4)
    }
    assert eval_queue(7, 42, 4) == "proof.eval.1"
    # Everything else stays on the default queue every worker consumes.
    assert route_task("investigations.fan_out_job_evaluations", [], {}, {}) is None
    assert route_task("investigations.evaluate_fleet_health", [7, "GPU-1"], {}, {}) is None


def test_one_queue_routes_nothing(settings: Any) -> None:
    settings.PROOF_EVAL_QUEUES = 1
    assert route_task(EVALUATE_JOB, [7, 42], {}, {}) is None
