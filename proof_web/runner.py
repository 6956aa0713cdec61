"""The embedded default's task runner: beat and a worker inside this process, no broker.

    runner = TaskRunner()    # the plan: every entry of proof_web/schedule.py's BEAT_SCHEDULE
    runner.start()           # a Celery worker (small thread pool) + the periodic sender
    runner.send_now()        # one tick now: every periodic task, whether due or not
    runner.wait_idle(60)     # until nothing sent since start is queued, waiting or running
    runner.stop()

Where a task goes is the Celery configuration chosen at startup (proof_web/settings.py): without
Redis (and under tests) the broker is Celery's in-process memory transport, so
`evaluate_job.delay(...)` — from a fan-out task, or from the services' `evaluation_due`
announcement after ingest committed a batch — puts a message on an in-process queue. The
runner is what consumes it:

- **the worker** is Celery's own `WorkController` (the thread pool, `concurrency` threads) on
  that queue, run in a thread of this process: it executes the registered task objects exactly
  as a `celery worker` process does — countdowns, acks, Django's per-task connection handling
  included. A task that raises is logged once by Celery's worker (`Task <name>[<id>] raised
  unexpected: …`, with its traceback), counted in `failures`, and not retried (no task here
  retries); the worker goes on with the next one.
- **the periodic sender** plays beat: it sends each entry of the schedule (`BEAT_SCHEDULE`
  unless a test passes another) with its own kwargs, every `every_seconds` of that entry — the
  first time one period after start, as beat does — through the task's `apply_async`, so the
  worker runs it like any other message. A send that fails is logged and retried at the
  entry's next period.

It refuses to start on a real broker (Redis: the worker and beat processes serve that) and
while another runner of this process runs (there is one in-process queue).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, signals
from django.conf import settings

from proof_web.celery import app as default_app
from proof_web.schedule import BEAT_SCHEDULE, Periodic

log = logging.getLogger(__name__)

# Celery's worker says "received" and "succeeded" for every task at INFO: in an embedded
# process that is most of its log. Failures (ERROR) still show.
_CHATTY_LOGGERS = ("celery.worker.strategy", "celery.app.trace", "celery.worker.consumer")


@dataclass
class PlannedTask:
    """One entry of the schedule as the runner sends it."""

    name: str
    task: str
    every_seconds: float
    kwargs: dict[str, Any] = field(default_factory=dict)
    next_due: float = 0.0
    sent: int = 0


def plan_of(schedule: Mapping[str, Periodic]) -> list[PlannedTask]:
    return [
        PlannedTask(name, entry.task, float(entry.every_seconds), dict(entry.kwargs or {}))
        for name, entry in schedule.items()
    ]


class TaskRunner:
    _active_lock = threading.Lock()
    _active: TaskRunner | None = None

    def __init__(
        self,
        schedule: Mapping[str, Periodic] | None = None,
        *,
        concurrency: int = 2,
        app: Celery | None = None,
        clock: Callable[[], float] = time.monotonic,
        quiet: bool = True,
    ) -> None:
        self.app = app or default_app
        self.plan = plan_of(BEAT_SCHEDULE if schedule is None else schedule)
        self.concurrency = concurrency
        self.clock = clock
        self.quiet = quiet
        self.completed: Counter[str] = Counter()  # task name → runs finished (ok or failed)
        self.failures: list[tuple[str, str]] = []  # (task name, repr of the exception)
        self._pending: set[str] = set()  # ids sent since start, not finished yet
        self._delayed: set[str] = set()  # those of them sent with a countdown (an ETA)
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._worker: Any = None
        self._worker_thread: threading.Thread | None = None
        self._beat_thread: threading.Thread | None = None
        self._receivers: list[tuple[Any, Callable[..., None]]] = []
        self.started = False

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        if not self.app.conf.broker_url.startswith("memory://"):
            raise RuntimeError(
                f"the in-process runner needs the in-process broker; tasks here go to "
                f"{self.app.conf.broker_url.split('@')[-1]} (run `celery -A proof_web.celery:app "
                "worker` and `beat` instead)"
            )
        with TaskRunner._active_lock:
            if TaskRunner._active is not None:
                raise RuntimeError("another in-process task runner is running")
            TaskRunner._active = self
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        # The app is every thread's app: a task enqueued from a worker thread (the fan-out's
        # evaluate_job.delay) resolves its shared task there, and Celery's current app is
        # thread-local (a `celery worker` process sets its app as the default too).
        self.app.set_default()
        # Celery's Django fixup runs django.setup() again when a worker loads its modules, and
        # with it LOGGING's dictConfig, which replaces the root logger's handlers: this
        # process configured its logging already (and a test's log capture hangs there).
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        self.app.loader.import_default_modules()  # every app's tasks module (autodiscovery)
        unknown = [p.task for p in self.plan if p.task not in self.app.tasks]
        if unknown:
            raise RuntimeError(f"the schedule names tasks nobody registered: {unknown}")
        if self.quiet:
            for name in _CHATTY_LOGGERS:
                logging.getLogger(name).setLevel(logging.WARNING)
        # Messages left on the in-process queue before this runner started (no runner was there
        # to take them) belong to nobody now.
        self.app.control.purge()
        self._connect()
        self._worker = self.app.WorkController(
            hostname=f"embedded-{os.getpid()}@{socket.gethostname()}",
            pool="threads",
            concurrency=self.concurrency,
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            ready_callback=lambda consumer: self._ready.set(),
        )
        root.handlers[:] = handlers
        root.setLevel(level)
        self._worker_thread = threading.Thread(
            target=self._worker.start, name="proof-task-worker", daemon=True
        )
        self._worker_thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the in-process Celery worker did not start within {timeout} s")
        self.arm()
        self._beat_thread = threading.Thread(target=self._beat, name="proof-beat", daemon=True)
        self._beat_thread.start()
        self.started = True
        log.info(
            "in-process tasks: a %d-thread worker; periodic %s",
            self.concurrency,
            ", ".join(f"{p.task} every {p.every_seconds:g} s" for p in self.plan),
        )

    def stop(self, timeout: float = 60.0) -> None:
        """Stop sending, let the worker finish the tasks it is running, and stop it. Tasks still
        queued or waiting for their countdown are dropped with the in-process queue."""
        self._stopping.set()
        if self._beat_thread is not None:
            self._beat_thread.join(timeout)
        if self._worker is not None and self._worker_thread is not None:
            # A warm shutdown: the consumer stops taking messages, the pool finishes the tasks
            # it runs. (Celery's signal handlers set a process-wide flag instead, which the
            # worker's loop notices only seconds later.)
            self._worker.stop()
            self._worker_thread.join(timeout)
            if self._worker_thread.is_alive():
                log.error("the in-process Celery worker did not stop within %s s", timeout)
        self._disconnect()
        self.started = False
        with TaskRunner._active_lock:
            if TaskRunner._active is self:
                TaskRunner._active = None

    def __enter__(self) -> TaskRunner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the periodic sender ----------------------------------------------------------------

    def _beat(self) -> None:
        while not self._stopping.is_set():
            self.tick()
            wait = min((p.next_due for p in self.plan), default=self.clock() + 60.0)
            self._stopping.wait(max(0.05, min(60.0, wait - self.clock())))

    def arm(self, now: float | None = None) -> None:
        """Start every entry's period at `now` (the clock's now): each is first due one of its
        periods later, as beat does with a new schedule. `start()` arms the plan."""
        now = self.clock() if now is None else now
        for planned in self.plan:
            planned.next_due = now + planned.every_seconds

    def tick(self, now: float | None = None) -> list[str]:
        """Send every entry due at `now` (the clock's now); each is next due one of its periods
        later. Returns the names sent."""
        now = self.clock() if now is None else now
        sent = []
        for planned in self.plan:
            if now >= planned.next_due:
                planned.next_due = now + planned.every_seconds
                if self._send(planned):
                    sent.append(planned.name)
        return sent

    def send_now(self, names: Iterable[str] | None = None) -> list[str]:
        """One tick now: send these entries (every entry by default) at once, due or not."""
        wanted = None if names is None else set(names)
        return [p.name for p in self.plan if (wanted is None or p.name in wanted) and self._send(p)]

    def _send(self, planned: PlannedTask) -> bool:
        try:
            self.app.tasks[planned.task].apply_async(kwargs=dict(planned.kwargs))
        except Exception:
            log.exception("could not send periodic task %s (%s)", planned.name, planned.task)
            return False
        planned.sent += 1
        return True

    # --- idleness -----------------------------------------------------------------------------

    def wait_idle(self, timeout: float = 60.0, *, delayed: bool = True) -> bool:
        """Wait until every task sent since start (periodic or enqueued by a task or a service)
        has finished — those sent with a countdown too, unless `delayed` is False; False if
        still busy after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending if delayed else self._pending - self._delayed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def _connect(self) -> None:
        def published(sender: Any = None, headers: Any = None, **kwargs: Any) -> None:
            task_id = (headers or {}).get("id")
            if task_id:
                with self._cond:
                    self._pending.add(task_id)
                    if (headers or {}).get("eta"):
                        self._delayed.add(task_id)

        def finished(sender: Any = None, task_id: str | None = None, **kwargs: Any) -> None:
            self._finish(task_id, getattr(sender, "name", None))

        def failed(sender: Any = None, exception: BaseException | None = None, **kw: Any) -> None:
            with self._cond:
                self.failures.append((getattr(sender, "name", "?"), repr(exception)))

        def dropped(sender: Any = None, **kwargs: Any) -> None:
            request = kwargs.get("request")
            message = kwargs.get("message")
            task_id = kwargs.get("id") or getattr(request, "id", None)
            if task_id is None and message is not None:
                task_id = (getattr(message, "headers", None) or {}).get("id")
            self._finish(task_id, None)

        for signal, receiver in (
            (signals.before_task_publish, published),
            (signals.task_postrun, finished),
            (signals.task_failure, failed),
            (signals.task_revoked, dropped),
            (signals.task_rejected, dropped),
            (signals.task_unknown, dropped),
        ):
            signal.connect(receiver, weak=False)
            self._receivers.append((signal, receiver))

    def _disconnect(self) -> None:
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        self._receivers.clear()
        with self._cond:
            self._pending.clear()
            self._delayed.clear()
            self._cond.notify_all()

    def _finish(self, task_id: str | None, name: str | None) -> None:
        with self._cond:
            if task_id in self._pending:
                self._pending.discard(task_id)
                self._delayed.discard(task_id)
                if name:
                    self.completed[name] += 1
                self._cond.notify_all()


def in_process() -> bool:
    """Whether tasks go to the in-process broker here (the embedded default, tests)."""
    return bool(settings.TASKS_IN_PROCESS)
