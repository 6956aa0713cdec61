"""Loaded into test worker processes (`celery worker --include investigations.tests.worker_hold`,
investigations/tests/celery_workers.py): a way to stop an evaluation in the middle, inside its
evaluation lock, so a test can kill the worker there deterministically.

Where PROOF_TEST_HOLD_DIR names a directory and its file `hold` holds a job id, the worker's next
evaluation of that job stops at the detectors (`investigations.live.detect_job`, called with the
lock held), writes `held-<pid>` (its content: the job id) and waits while `hold` exists (at most
HOLD_WAIT_S), then goes on. Without the variable, or the file, nothing changes.

Imports nothing of the project at import time: a worker imports `--include` modules before
Django's app registry is ready.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import signals

HOLD_ENV = "PROOF_TEST_HOLD_DIR"
HOLD_WAIT_S = 120.0

_patched: dict[str, bool] = {}


def _install(**kwargs: Any) -> None:
    """Wrap detect_job, once per process, at its first task (the registry is ready by then)."""
    directory = os.environ.get(HOLD_ENV)
    if not directory or _patched.get("detect_job"):
        return
    _patched["detect_job"] = True
    from investigations import live

    original = live.detect_job
    hold = Path(directory) / "hold"

    def detect_job(*args: Any, **kwargs: Any) -> Any:  # (operator_id, job, t0, t1, ...)
        job = str(kwargs.get("job", args[1] if len(args) > 1 else ""))
        try:
            held = hold.read_text() == job
        except FileNotFoundError:
            held = False
        if held:
            (Path(directory) / f"held-{os.getpid()}").write_text(job)
            deadline = time.monotonic() + HOLD_WAIT_S
            while hold.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return original(*args, **kwargs)

    live.detect_job = detect_job


signals.task_prerun.connect(_install, weak=False)
