"""Real `celery -A proof_web.celery:app worker` processes for tests, on a private Redis
database and this test run's database, and a simulated run stored through ingest in slices.

Under PROOF_ENV=test the settings send tasks to the in-process memory broker (TASKS_IN_PROCESS),
so a test that wants production's worker processes starts them itself, with the environment a
production worker has: PROOF_ENV other than "test" and REDIS_URL set (Redis is then the broker
and the cache, so the evaluation lock is shared through Redis as in production), and
DATABASE_URL naming the application role on pytest's test database (no owner credentials:
workers never hold them). The Redis database is claimed for the test run alone
(`private_redis`: other runs of the suite on the machine, sharing the Redis server, claim
another), so no other queue mixes in.

Each worker runs in a session of its own, so `kill()` SIGKILLs the main process and its prefork
children together, as a lost node or an OOM-killed container does.

Every worker loads investigations/tests/worker_hold.py (`--include`), which lets a test stop an
evaluation inside the evaluation lock and kill the worker there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from contract.wire.encode import BatchBuilder
from ingest import services as ingest_services
from ingest.processing import Limits, decode_batch
from investigations.tests import worker_hold
from investigations.tests.live_helpers import register_gpus
from simulator import simulate

REPO = Path(__file__).resolve().parents[2]
# Redis database numbers a test run may claim for its workers (0, the settings' default, never).
PRIVATE_DBS = range(15, 7, -1)
CLAIM_KEY = "proof-test:worker-db-claim"
CLAIM_TTL_S = 900
BATCH_SECONDS = 10.0


# --- in the test -------------------------------------------------------------------------------


def worker_env(redis_url: str, hold_dir: Path) -> dict[str, str]:
    """A production worker's environment on this test run's database and `redis_url`."""
    from django.db import connection

    db = connection.settings_dict
    if connection.vendor != "postgresql":
        raise RuntimeError("worker processes need PostgreSQL (DATABASE_URL), not SQLite")
    url = (
        f"postgres://{quote(str(db['USER']))}:{quote(str(db['PASSWORD'] or ''))}"
        f"@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{quote(str(db['NAME']))}"
    )
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_OWNER_URL"}
    env.update(
        PROOF_ENV="development",
        PROOF_DEBUG="false",
        PROOF_LOG_LEVEL="WARNING",
        DATABASE_URL=url,
        REDIS_URL=redis_url,
        # One evaluation queue (investigations/routing.py): the workers consume the default
        # queue, where the test's sender and the fan-out put every evaluation.
        PROOF_EVAL_QUEUES="1",
        PYTHONUNBUFFERED="1",
    )
    env[worker_hold.HOLD_ENV] = str(hold_dir)
    return env


class Worker:
    """One `celery worker` process (prefork) in a session of its own, logging to `log_path`."""

    def __init__(
        self, name: str, env: dict[str, str], log_path: Path, *, concurrency: int = 2
    ) -> None:
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "proof_web.celery:app",
            "worker",
            "--include",
            worker_hold.__name__,
            "--pool",
            "prefork",
            "--concurrency",
            str(concurrency),
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"{name}@%h",
        ]
        self.name = name
        self.log_path = log_path
        self.started = time.time()
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Until the worker says it is ready (consuming); the wall time it became so."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.log():
                return time.time()
            if self.proc.poll() is not None:
                raise AssertionError(f"worker {self.name} exited: {self.log()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"worker {self.name} not ready in {timeout} s: {self.log()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes at once (no warm or cold shutdown)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        # The pool processes are reparented once the main process is gone: wait until the
        # whole group is gone, so none still holds a database connection.
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            except PermissionError:  # only zombies left, owned by the reaper
                return
            time.sleep(0.05)


def sender(redis_url: str) -> Any:
    """A Celery app bound to `redis_url` that only sends (by task name), as beat does."""
    from celery import Celery

    app = Celery("proof-worker-test", broker=redis_url, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = True
    return app


@contextlib.contextmanager
def private_redis(base_url: str) -> Iterator[str]:
    """A Redis database of `base_url`'s server for this run alone: the first of PRIVATE_DBS
    that no other run has claimed (SET NX of CLAIM_KEY, expiring in case a run dies), emptied
    before and after (queues, unacked messages, locks: everything but the claim)."""
    import redis

    parts = urlsplit(base_url)
    token = f"{os.getpid()}-{uuid.uuid4().hex}"
    for db in PRIVATE_DBS:
        url = urlunsplit(parts._replace(path=f"/{db}"))
        client = redis.Redis.from_url(url)
        try:
            if client.set(CLAIM_KEY, token, nx=True, ex=CLAIM_TTL_S):
                break
        finally:
            client.close()
    else:
        raise RuntimeError(f"no free Redis database among {list(PRIVATE_DBS)} of {base_url}")
    client = redis.Redis.from_url(url)
    try:
        _empty(client)
        yield url
    finally:
        _empty(client)
        if client.get(CLAIM_KEY) == token.encode():
            client.delete(CLAIM_KEY)
        client.close()


def _empty(client: Any) -> None:
    for key in client.scan_iter():
        if key != CLAIM_KEY.encode():
            client.delete(key)


def wait_for(
    done: Callable[[], object], timeout: float, what: str, tick: Callable[[], None] | None = None
) -> float:
    """Poll `done` (calling `tick` each round, e.g. the test's beat) until true; the seconds it
    took. Raises AssertionError naming `what` on timeout."""
    began = time.monotonic()
    while True:
        if tick is not None:
            tick()
        if done():
            return time.monotonic() - began
        if time.monotonic() - began > timeout:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.25)


class SlicedRun:
    """One simulated scenario, stored through ingest's real services in data-time slices (each
    slice in BATCH_SECONDS batches with increasing sequence numbers, as one agent ships them)."""

    def __init__(
        self,
        operator_id: int,
        scenario: str,
        *,
        duration_s: float,
        end_ts: float,
        seed: int = 1,
        gpus_per_node: int = 2,
    ) -> None:
        self.operator_id = operator_id
        run = simulate(
            scenario,
            seed=seed,
            duration_s=duration_s,
            nodes=1,
            gpus_per_node=gpus_per_node,
            start_ts=end_ts - duration_s,
        )
        self.meta = run.meta
        self.start_ts = float(run.start_ts)
        self.records = sorted(run.records(), key=lambda r: float(r["ts"]))
        truth = run.meta.get("truth") or {}
        self.family = str(truth["family"])
        self.job = str(truth["subject"]["job"])
        self.onset = float(truth["onset"])
        self._builder = BatchBuilder(f"sim-{scenario}-{seed}")
        self._limits = Limits()
        self._sequence = 0
        self._next = 0
        self.stored_through = self.start_ts
        register_gpus(operator_id, self.records)

    def _flush(self) -> None:
        if len(self._builder):
            self._sequence += 1
            decoded = decode_batch(self._builder.build(self._sequence), self._limits)
            ingest_services.store_batch(self.operator_id, decoded)

    def store_until(self, ts: float) -> None:
        """Store every record before data time `ts` not stored yet."""
        batch_end = self.stored_through + BATCH_SECONDS
        while self._next < len(self.records) and float(self.records[self._next]["ts"]) < ts:
            record = self.records[self._next]
            if float(record["ts"]) >= batch_end:
                self._flush()
                while float(record["ts"]) >= batch_end:
                    batch_end += BATCH_SECONDS
            self._builder.add(record)
            self._next += 1
        self._flush()
        self.stored_through = max(self.stored_through, ts)

    def store_all(self) -> None:
        self.store_until(float("inf"))
