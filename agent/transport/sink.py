"""The runtime Sink that streams to ingest (`proof-agent run --server HOST:PORT --token T`).

`submit()` only encodes into the current batch; a batch is cut every `max_batch_samples`
samples, when its records reach half the server's `max_batch_bytes` (Register says it; a tick
with megabytes of job output becomes several batches, none the server would refuse), or at
`flush()`, written to the on-disk spool (agent/spool.py) when there is one, and
handed to a background thread that feeds the BatchSender. With a spool, batches survive agent
restarts and long ingest outages, and are removed from disk only once acked; the spool's
sequence numbers never repeat, so they are the batches' sequence numbers. Without one, a
bounded in-memory queue holds what is not yet sent (the oldest dropped, and counted, if full).

A batch ingest refuses (INVALID_ARGUMENT: it would be refused again) goes to the dead letter
(agent/spool.py `DeadLetter`, `<spool dir>/dead-letter/`): its bytes, the reason and the batch
as a v1 trace; it leaves the spool's flow (the spool acks past it) and the batches after it go
on. Each refusal is logged (one line, with the file) and reported to ingest as a
`batch_refused` event in the next batch; the agent's own reports a batch refused for its size
carried (`batch_refused`, `spool_dropped`) ride again in the next one, so a report is not lost
with a batch of job output too big to store (not after other refusals: the report itself could
be what ingest refuses).
"""

from __future__ import annotations

import collections
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from agent.spool import DEAD_LETTER_DIR, DeadLetter, Spool
from contract import limits, signals
from contract.wire.client import BatchSender, EncodedBatch, TlsConfig, open_channel
from contract.wire.decode import batch_records, write_trace
from contract.wire.encode import BatchBuilder

log = logging.getLogger(__name__)

AGENT_ID_FILE = "agent_id"
_REPORTS = frozenset({signals.EVENT_BATCH_REFUSED, signals.EVENT_SPOOL_DROPPED})
DEFAULT_MAX_BATCH_BYTES = 32 * 1024 * 1024  # ingest's default PROOF_INGEST_MAX_BATCH_BYTES


class GrpcSink:
    def __init__(
        self,
        sender: BatchSender,
        agent_id: str,
        *,
        spool: Any = None,
        first_sequence: int = 1,
        max_batch_samples: int = 50_000,
        max_memory_batches: int = 1000,
        dead_letter: DeadLetter | None = None,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
    ) -> None:
        self.sender = sender
        self.agent_id = agent_id
        self.spool = spool
        if dead_letter is None:
            directory = (
                Path(spool.directory).parent / DEAD_LETTER_DIR if spool is not None else None
            )
            dead_letter = DeadLetter(directory, render=_render_dead_letter)
        self.dead_letter = dead_letter
        self.builder = BatchBuilder(agent_id)
        self.max_batch_samples = max_batch_samples
        self.max_batch_bytes = max_batch_bytes
        self._record_budget = max(max_batch_bytes // 2, 4096)
        self.dropped_batches = 0
        # Spool drops already reported (log line + `spool_dropped` event in the next batch).
        self._reported_drops = spool.dropped_batches if spool is not None else 0
        self._next_sequence = first_sequence
        self._memory: collections.deque[Any] = collections.deque(maxlen=max_memory_batches)
        self._lock = threading.Lock()
        self._wake = threading.Condition()
        self._closing = False
        self._done: set[int] = set()
        self._acked_through = 0
        self._last_sent = 0
        sender.on_ack = lambda ack: self._finished(int(ack.sequence))
        sender.on_reject = self._refused
        self._thread = threading.Thread(target=self._pump, name="proof-sink", daemon=True)
        self._thread.start()

    # --- Sink protocol ------------------------------------------------------------------------

    def submit(self, records: Sequence[Any]) -> None:
        with self._lock:
            builder = self.builder
            add = builder.add
            for record in records:
                add(record)
                if builder.record_bytes >= self._record_budget:
                    self._cut()
            if builder.samples >= self.max_batch_samples:
                self._cut()

    def flush(self) -> None:
        with self._lock:
            self._cut()

    def close(self, timeout: float = 30.0) -> None:
        self.flush()
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        self._thread.join(timeout=timeout)
        self.sender.close(timeout=timeout)
        if self.spool is not None:
            self.spool.close()

    # --- internals ----------------------------------------------------------------------------

    def _cut(self) -> None:
        if not len(self.builder):
            return
        if self.spool is not None:
            sequence = self.spool.next_seq
            stored = self.spool.append(self.builder.build_bytes(sequence))
            if stored != sequence:
                raise RuntimeError(f"the spool stored batch {stored}, expected {sequence}")
            self._report_drops()
        else:
            sequence = self._next_sequence
            batch = EncodedBatch(sequence, self.builder.build_bytes(sequence))
            self._next_sequence += 1
            if len(self._memory) == self._memory.maxlen:
                self.dropped_batches += 1
            self._memory.append(batch)
        with self._wake:
            self._wake.notify_all()

    def _report_drops(self) -> None:
        """The spool hit its cap and dropped its oldest batches: say so in the log and as an
        event the server stores (it rides in the next batch)."""
        dropped = self.spool.dropped_batches
        if dropped <= self._reported_drops:
            return
        new = dropped - self._reported_drops
        self._reported_drops = dropped
        log.warning(
            "spool full (cap %d bytes): dropped the %d oldest unsent batch(es), %d in all "
            "(%d bytes), through sequence %d",
            self.spool.max_bytes,
            new,
            dropped,
            self.spool.dropped_bytes,
            self.spool.dropped_through,
        )
        self.builder.extend(
            [
                {
                    "type": "event",
                    "ts": time.time(),
                    "name": signals.EVENT_SPOOL_DROPPED,
                    "value": new,
                    "text": f"agent spool full: {new} oldest unsent batch(es) dropped "
                    f"({dropped} since the spool was created, through sequence "
                    f"{self.spool.dropped_through})",
                    "labels": {
                        "dropped_total": str(dropped),
                        "dropped_bytes": str(self.spool.dropped_bytes),
                    },
                }
            ]
        )

    def _next_batches(self) -> list[Any]:
        if self.spool is not None:
            # Sent as the spool holds them: no decoding and re-encoding on the way out.
            return [
                EncodedBatch(seq, data)
                for seq, data in self.spool.peek(self.sender.window, after=self._last_sent)
            ]
        out: list[Any] = []
        while self._memory and len(out) < self.sender.window:
            out.append(self._memory.popleft())
        return out

    def _pump(self) -> None:
        while True:
            batches = self._next_batches()
            if not batches:
                with self._wake:
                    if self._closing:
                        return
                    self._wake.wait(0.5)
                continue
            for batch in batches:
                try:
                    self.sender.send(batch)
                except PermissionError as exc:
                    log.error("%s; the agent keeps spooling", exc)
                    return
                self._last_sent = batch.sequence

    def _refused(self, sequence: int, reason: str, data: bytes) -> None:
        """Ingest refused batch `sequence`: keep it in the dead letter, say so (log line and a
        `batch_refused` event in the next batch), and let the spool move past it."""
        try:
            path = self.dead_letter.add(sequence, data, reason, agent_id=self.agent_id)
        except OSError as exc:
            path = None
            log.error("cannot write the dead letter of batch %s: %s", sequence, exc)
        where = f"kept in {path}" if path is not None else "kept in memory"
        log.error(
            "ingest refused batch %s (%d bytes): %s; %s (dead letter, %d batch(es) so far)",
            sequence,
            len(data),
            reason,
            where,
            self.dead_letter.added,
        )
        carried = _reports_in(data) if _for_size(reason) else []
        with self._lock:
            self.builder.extend(
                [
                    *carried,
                    {
                        "type": "event",
                        "ts": time.time(),
                        "name": signals.EVENT_BATCH_REFUSED,
                        "value": float(sequence),
                        "text": f"ingest refused agent batch {sequence}: {reason}"[:2000],
                        "labels": {
                            "dead_letter_total": str(self.dead_letter.added),
                            "bytes": str(len(data)),
                        },
                    },
                ]
            )
        self._finished(sequence)

    def _finished(self, sequence: int) -> None:
        """An ack (or a rejection): advance the spool's cumulative ack over contiguous ones."""
        if self.spool is None:
            return
        with self._lock:
            self._done.add(sequence)
            through = self._acked_through
            # Batches the spool dropped at its cap are never sent, so never acked: past them.
            done = max(self.spool.acked_through, self.spool.dropped_through)
            while through + 1 in self._done or through + 1 <= done:
                through += 1
                self._done.discard(through)
            if through > self._acked_through:
                self._acked_through = through
                if through > self.spool.acked_through:
                    self.spool.ack(through)


def _for_size(reason: str) -> bool:
    """A refusal for the batch's size: ingest's limit, or gRPC's message limit (client.py)."""
    return "over the limit of" in reason or "message size limit" in reason


def _reports_in(data: bytes) -> list[dict[str, Any]]:
    """The agent's own reports (`_REPORTS` events) in a refused batch's bytes, to send again;
    none when the batch cannot be decoded."""
    try:
        records = batch_records(data)
    except Exception as exc:  # a batch ingest could not decode either
        log.debug("cannot read the reports of a refused batch: %s", exc)
        return []
    return [r for r in records if r["type"] == "event" and r.get("name") in _REPORTS]


def _render_dead_letter(path: Path, data: bytes, meta: dict[str, Any]) -> None:
    write_trace(path, data, meta)


def _agent_id(spool_dir: str | None, meta: dict[str, Any]) -> str:
    """The agent id: the meta's, the spool's, or a new one — within ingest's limit (a long
    hostname must not make an id every batch of which ingest refuses)."""
    return limits.clean_identifier(_stored_agent_id(spool_dir, meta), limits.MAX_AGENT_ID_CHARS)


def _new_agent_id() -> str:
    return f"{socket.gethostname()[:100]}-{uuid.uuid4().hex[:12]}"


def _stored_agent_id(spool_dir: str | None, meta: dict[str, Any]) -> str:
    if meta.get("agent_id"):
        return str(meta["agent_id"])
    if spool_dir:
        path = Path(spool_dir) / AGENT_ID_FILE
        if path.exists():
            return path.read_text().strip()
        Path(spool_dir).mkdir(parents=True, exist_ok=True)
        value = _new_agent_id()
        path.write_text(value + "\n")
        return value
    return _new_agent_id()


def make_sink(
    *,
    server: str,
    token: str,
    spool_dir: str | None = None,
    meta: dict[str, Any] | None = None,
    spool_max_bytes: int | None = None,
    tls: TlsConfig | str | None = "auto",
) -> GrpcSink:
    """The factory `proof-agent run --server` uses. `tls="auto"`: plaintext to a loopback
    server, TLS (the system's roots, or PROOF_AGENT_CA_CERT) to anything else; a TlsConfig or
    None (plaintext) as the config's [server] tls/ca_file say."""
    meta = dict(meta or {})
    if tls == "auto":
        host = server.rsplit(":", 1)[0].strip("[]")
        loopback = host in ("localhost", "127.0.0.1", "::1")
        tls = None if loopback else TlsConfig(root_cert=os.environ.get("PROOF_AGENT_CA_CERT"))
    if isinstance(tls, str):
        raise ValueError(f"tls must be 'auto', a TlsConfig or None, not {tls!r}")
    sender = BatchSender(open_channel(server, tls), token)
    agent_id = _agent_id(spool_dir, meta)

    def register(wait: bool = False) -> Any:
        return sender.register(
            agent_id=agent_id,
            hostname=str(meta.get("node") or socket.gethostname()),
            agent_version=str(meta.get("agent_version") or ""),
            gpus=[
                {
                    k: g[k]
                    for k in (
                        "uuid",
                        "index",
                        "model",
                        "memory_mib",
                        "driver_version",
                        "cuda_version",
                    )
                    if g.get(k) is not None
                }
                for g in meta.get("gpus") or []
            ],
            wait_for_ready=wait,
        )

    try:
        reply = register()
    except grpc.RpcError as exc:
        unreachable = exc.code() in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )
        if not (spool_dir and unreachable):
            raise
        # Started during an ingest outage: collect into the spool now, register (and send)
        # once ingest answers; the stream itself reconnects with backoff.
        log.warning("ingest %s unreachable at start; spooling until it answers", server)
        reply = None
        threading.Thread(
            target=_register_later, args=(register,), name="proof-register", daemon=True
        ).start()
    spool = None
    if spool_dir:
        spool = Spool(
            Path(spool_dir) / "batches",
            **({"max_bytes": spool_max_bytes} if spool_max_bytes else {}),
        )
        if (
            reply is not None
            and reply.last_sequence >= spool.next_seq
            and not spool.pending_batches
        ):
            # The spool was wiped but ingest remembers this id's sequences: take a new id
            # rather than have fresh batches mistaken for resends.
            (Path(spool_dir) / AGENT_ID_FILE).unlink(missing_ok=True)
            agent_id = _agent_id(spool_dir, {})
        return GrpcSink(sender, agent_id, spool=spool, max_batch_bytes=_batch_limit(reply))
    return GrpcSink(
        sender,
        agent_id,
        first_sequence=int(reply.last_sequence) + 1,
        max_batch_bytes=_batch_limit(reply),
    )


def _batch_limit(reply: Any) -> int:
    """The server's batch size limit from its Register reply (ingest's default when it has
    not answered yet)."""
    if reply is not None and int(reply.max_batch_bytes or 0) > 0:
        return int(reply.max_batch_bytes)
    return DEFAULT_MAX_BATCH_BYTES


def _register_later(register: Any, max_delay: float = 60.0) -> None:
    """Retry Register (waiting for the channel) with jittered, capped backoff until it works."""
    delay = 1.0
    while True:
        try:
            register(wait=True)
            log.info("registered with ingest")
            return
        except grpc.RpcError as exc:
            if exc.code() in (
                grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.PERMISSION_DENIED,
            ):
                log.error("ingest refused the agent token: %s", exc.details())
                return
        time.sleep(random.uniform(delay / 2, delay))  # noqa: S311 - reconnect jitter, not a secret
        delay = min(max_delay, delay * 2)


def check_server(cfg: Any, timeout: float = 10.0) -> None:
    """`proof-agent doctor`: prove the token with a real Register call (raises if refused)."""
    section = cfg.server
    tls = TlsConfig(root_cert=section.ca_file or None) if section.tls else None
    sender = BatchSender(open_channel(section.address, tls), cfg.resolved_token())
    try:
        sender.register(agent_id="doctor", hostname=socket.gethostname(), agent_version="doctor")
    finally:
        sender.close(timeout=1)
