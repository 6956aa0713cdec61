"""The production pipeline as the fault suite runs it, every part a real process it can kill:

- `RedisServer`: a private `redis-server` on a free loopback port, no persistence (as the
  machine's own Redis), that a test SIGKILLs and starts again on the same port. The machine's
  Redis, which other engineers' tests share, is never touched.
- `TcpProxy`: a loopback TCP proxy the test controls in front of PostgreSQL. `cut()` resets every
  connection through it and refuses new ones — what ingest and the workers see when PostgreSQL
  restarts — and `restore()` accepts again. The machine's PostgreSQL server is shared by every
  engineer on it: it is never restarted, and no backend but those behind the proxy is touched.
- `IngestProcess`: `proof ingest` (one process, two writer threads) on a fixed port, its
  database through the proxy, Redis as broker and cache (production's settings: PROOF_ENV is
  not "test"), SIGKILLed and restarted on that port.
- Celery workers: investigations/tests/celery_workers.py `Worker` (prefork, in a session of its
  own, SIGKILLed with its pool), with the same environment as ingest.
- `Beat`: the job fan-out sent every BEAT_S as production's beat sends it (by task name, to the
  broker); a send while Redis is down fails, is counted and the next tick tries again.

The agent is a real `proof-agent run` process (tests/agentproc.py), simulated GPUs, its spool
on disk. What a test reads back goes through tests/helpers.py (receipts, samples stored).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

from django.db import connection

from investigations.models import Incident, JobActivity
from investigations.tests import worker_hold
from investigations.tests.celery_workers import Worker, sender, wait_for
from tenants.context import tenant_context

REPO = Path(__file__).resolve().parents[2]
_LINGER_RST = struct.pack("ii", 1, 0)  # struct linger {on, 0 s}: close() sends RST
BEAT_S = 2.0  # production's fan-out period is 15 s; faster keeps the suite short


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TcpProxy:
    """A TCP proxy on 127.0.0.1:`port` to `target`; `cut()` / `restore()` (see module doc)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.connections_cut = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Reset every connection through the proxy and refuse new ones."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            live, self._sockets = self._sockets, set()
        for sock in live:
            with contextlib.suppress(OSError):
                # Closed with RST (linger 0), as on a server crash. shutdown() first: close()
                # alone does not end a connection another thread is blocked reading, and
                # PostgreSQL would keep that backend (and its transaction's locks).
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.connections_cut += len(live) // 2

    def close(self) -> None:
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._sockets |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


class RedisServer:
    """A private redis-server on a free loopback port, without persistence."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.directory)]
        argv += ["--logfile", str(self.directory / "redis.log")]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        wait_for(self.answers, 20.0, "the private redis-server to answer")

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: every queued message, unacked delivery and lock in it is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=30)
        self.proc = None


def database_url(host: str, port: int) -> str:
    """The application role's URL for this test run's database, at host:port."""
    db = connection.settings_dict
    if connection.vendor != "postgresql":
        raise RuntimeError("the fault suite needs PostgreSQL (DATABASE_URL), not SQLite")
    return (
        f"postgres://{quote(str(db['USER']))}:{quote(str(db['PASSWORD'] or ''))}"
        f"@{host}:{port}/{quote(str(db['NAME']))}"
    )


def production_env(database: str, redis_url: str, hold_dir: Path) -> dict[str, str]:
    """What production's ingest and workers run with: Redis as broker and cache, the
    application role's database, no owner credentials."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_OWNER_URL"}
    env.update(
        PROOF_ENV="development",
        PROOF_DEBUG="false",
        PROOF_LOG_LEVEL="WARNING",
        DATABASE_URL=database,
        REDIS_URL=redis_url,
        PROOF_EVAL_QUEUES="1",  # one evaluation queue: the workers consume the default one
        PYTHONUNBUFFERED="1",
    )
    env[worker_hold.HOLD_ENV] = str(hold_dir)
    return env


class IngestProcess:
    """`proof ingest` in a session of its own on a fixed loopback port."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return "".join(
            p.read_text(errors="replace") for p in sorted(self.logs.glob("ingest-*.log"))
        )

    def start(self) -> None:
        self.starts += 1
        path = self.logs / f"ingest-{self.starts}.log"
        argv = [sys.executable, "-m", "proof_web.cli", "ingest", "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--workers", "1", "--writers", "2"]
        with path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = self.proc

        def listening() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"ingest exited: {path.read_text()[-3000:]}")
            return "ingest: listening on" in path.read_text(errors="replace")

        wait_for(listening, 60.0, "ingest to listen")

    def kill(self) -> None:
        """SIGKILL mid-stream: queued batches, open transactions and unsent acks are lost."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)
        self.proc = None


class Beat:
    """The job fan-out every BEAT_S to the workers' broker; sends that fail are counted."""

    def __init__(self, redis_url: str) -> None:
        self.app = sender(redis_url)
        self.last = 0.0
        self.sent = 0
        self.failed = 0

    def __call__(self) -> None:
        if time.monotonic() - self.last < BEAT_S:
            return
        self.last = time.monotonic()
        try:
            self.app.send_task("investigations.fan_out_job_evaluations", retry=False)
            self.sent += 1
        except Exception:  # the broker is down: beat tries again at its next tick
            self.failed += 1

    def close(self) -> None:
        self.app.close()


class Stack:
    """Redis, the PostgreSQL proxy, ingest and the workers of one test (see module doc)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hold_dir = tmp / "hold"
        self.hold_dir.mkdir()
        db = connection.settings_dict
        self.redis = RedisServer(tmp / "redis")
        self.pg = TcpProxy(str(db["HOST"] or "127.0.0.1"), int(db["PORT"] or 5432))
        self.env = production_env(
            database_url("127.0.0.1", self.pg.port), self.redis.url, self.hold_dir
        )
        self.ingest = IngestProcess(self.env, tmp)
        self.workers: list[Worker] = []
        self.beat = Beat(self.redis.url)

    def start_worker(self) -> Worker:
        n = len(self.workers)
        worker = Worker(f"fault-{n}", self.env, self.tmp / f"worker-{n}.log")
        self.workers.append(worker)
        return worker

    def hold(self, job: str) -> None:
        """Stop the workers' next evaluation of `job` inside its lock (worker_hold)."""
        (self.hold_dir / "hold.tmp").write_text(job)
        (self.hold_dir / "hold.tmp").rename(self.hold_dir / "hold")

    def held(self) -> bool:
        return any(self.hold_dir.glob("held-*"))

    def release(self) -> None:
        (self.hold_dir / "hold").unlink(missing_ok=True)

    def close(self) -> None:
        self.release()
        for worker in self.workers:
            worker.kill()
        self.ingest.kill()
        self.beat.close()
        self.pg.close()
        self.redis.kill()
        for worker in self.workers:  # shown with a failure (captured output)
            print(f"--- {worker.log_path.name}\n{worker.log()[-3000:]}")
        print(f"--- ingest\n{self.ingest.log()[-3000:]}")


# --- what the tests read back ------------------------------------------------------------------


def incidents(operator_id: int) -> list[Incident]:
    with tenant_context(operator_id):
        return list(Incident.objects.for_tenant(operator_id).order_by("pk"))


def activities(operator_id: int) -> list[JobActivity]:
    with tenant_context(operator_id):
        return list(JobActivity.objects.for_tenant(operator_id).order_by("pk"))


def evaluated_through_last_data(operator_id: int) -> bool:
    """Every job with data was evaluated through its last data."""
    rows = activities(operator_id)
    return bool(rows) and all(
        a.evaluated_through_ts is not None and a.evaluated_through_ts >= a.last_data_ts
        for a in rows
    )
