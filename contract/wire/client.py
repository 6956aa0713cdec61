"""The agent's gRPC client: register, then stream batches and collect acks.

`BatchSender` owns delivery: it keeps every batch until the server acks it, with at most
`window` batches in flight (a full window blocks `send`, which is how server backpressure
reaches the agent), and when a stream breaks it opens a new one and resends every unacked
batch in sequence order — the server stores each (agent id, sequence) once, so a resend after
a lost ack is harmless. A batch the server refuses (INVALID_ARGUMENT naming its sequence: it
would be refused again) leaves the window at once, is reported through `on_reject(seq, reason,
bytes)` — the sink keeps it in its dead letter — and the rest flows on; everything else is
retried until `close()` gives up, after a backoff that grows with the failures of the batch that
broke the stream (ingest names it: "batch N could not be stored"; else the oldest unacked one):
only its ack starts the backoff over — not the acks of the batches around it, which can come
in any order with several writers — so a batch that keeps failing is not resent in a tight
loop. `stats` counts every send. An ack that says records of the batch
were refused alone (the rest stored) is counted in `stats.records_refused` and logged once a
minute at most.
"""

from __future__ import annotations

import logging
import queue
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from contract.wire import ingest_pb2, ingest_pb2_grpc

log = logging.getLogger(__name__)

REJECTED_SEQUENCE_KEY = "proof-rejected-sequence"
_TOO_LARGE = re.compile(r"larger than max \((\d+) vs\. (\d+)\)")
# How ingest (ingest/server.py) names the batch whose store failed when it ends a stream.
_NOT_STORED = re.compile(r"\bbatch (\d+) could not be stored\b")
_END = object()
_STREAM_METHOD = "/proof.ingest.v1.Ingest/Stream"


class EncodedBatch:
    """A Batch already serialized (as the spool stores it): sent as is, never re-encoded."""

    __slots__ = ("data", "sequence")

    def __init__(self, sequence: int, data: bytes) -> None:
        self.sequence = sequence
        self.data = data


def _serialize_batch(batch: Any) -> bytes:
    if isinstance(batch, EncodedBatch):
        return batch.data
    return batch.SerializeToString()  # type: ignore[no-any-return]


@dataclass(frozen=True)
class TlsConfig:
    root_cert: str | None = None  # PEM path; None: the system's roots
    server_name: str | None = None  # override for the certificate's host name check


def open_channel(
    target: str, tls: TlsConfig | None = None, max_message_bytes: int = 64 * 1024 * 1024
) -> grpc.Channel:
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        # gRPC's own reconnect backoff (default cap 120 s) under the sender's, so a stream is
        # back within about a minute of ingest's return.
        ("grpc.initial_reconnect_backoff_ms", 500),
        ("grpc.max_reconnect_backoff_ms", 30_000),
    ]
    if tls is None:
        return grpc.insecure_channel(target, options=options)
    root = None
    if tls.root_cert:
        with open(tls.root_cert, "rb") as fh:
            root = fh.read()
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(root), options=options)


@dataclass
class SenderStats:
    acked: int = 0
    duplicates: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)
    reconnects: int = 0
    ack_latencies: list[float] = field(default_factory=list)
    sends: int = 0  # batches put on a stream, first sends and resends
    resends: int = 0
    max_attempts: int = 0  # the most sends one batch needed before its ack or refusal
    records_refused: int = 0  # records ingest refused alone (their batches were stored)
    samples_refused: int = 0


REFUSED_LOG_INTERVAL_S = 60.0


class RejectedBatch(Exception):
    pass


class BatchSender:
    """Reliable, windowed delivery of Batches over one channel (see the module docstring)."""

    def __init__(
        self,
        channel: grpc.Channel,
        token: str,
        *,
        window: int = 8,
        retry_delay: float = 0.5,
        max_retry_delay: float = 60.0,
        on_ack: Callable[[Any], None] | None = None,
        on_reject: Callable[[int, str, bytes], None] | None = None,
        keep_latencies: bool = True,
    ) -> None:
        self.stub = ingest_pb2_grpc.IngestStub(channel)
        # Stream takes Batch messages or EncodedBatch (bytes the sink has already encoded).
        self._stream = channel.stream_stream(
            _STREAM_METHOD,
            request_serializer=_serialize_batch,
            response_deserializer=ingest_pb2.Ack.FromString,
        )
        self.metadata = (("authorization", f"Bearer {token}"),)
        self.window = window
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self._failures = 0  # consecutive broken streams without an ack: the backoff exponent
        self.backoff_delays: list[float] = []  # the last reconnect waits, for tests/doctor
        self.on_ack = on_ack
        self.on_reject = on_reject
        self.keep_latencies = keep_latencies
        self.stats = SenderStats()
        self._lock = threading.Condition()
        self._unacked: dict[int, tuple[Any, float]] = {}  # sequence -> (batch, sent at)
        # One outbox per stream: a broken stream's request generator may still be blocked on
        # its queue, and must not swallow batches meant for the next stream.
        self._outbox: queue.Queue[Any] = queue.Queue()
        self._attempts: dict[int, int] = {}  # sequence -> sends so far (unacked batches)
        self._head: int | None = None  # the batch whose ack resets the backoff (this stream)
        self._failing: int | None = None  # the batch the last broken stream's error named
        self._refused_logged_at = -1e18
        self._closed = False
        self._fatal: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="proof-sender", daemon=True)
        self._thread.start()

    def register(
        self,
        *,
        agent_id: str,
        hostname: str,
        agent_version: str,
        gpus: Sequence[dict[str, Any]] = (),
        wait_for_ready: bool = False,
    ) -> Any:
        request = ingest_pb2.RegisterRequest(
            agent_id=agent_id, hostname=hostname, agent_version=agent_version
        )
        for gpu in gpus:
            request.gpus.add(**gpu)
        return self.stub.Register(
            request, metadata=self.metadata, timeout=30, wait_for_ready=wait_for_ready
        )

    def send(self, batch: Any, timeout: float | None = None) -> None:
        """Queue a batch (a Batch or an EncodedBatch) for delivery; blocks while `window`
        batches await their ack."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while len(self._unacked) >= self.window and self._fatal is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError("the ingest server did not ack in time")
                self._lock.wait(remaining)
            if self._fatal is not None:
                raise self._fatal
            self._unacked[batch.sequence] = (batch, time.monotonic())
            self._outbox.put(batch)

    def unacked(self) -> int:
        with self._lock:
            return len(self._unacked)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every sent batch is acked (or rejected); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._unacked and self._fatal is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._lock.wait(remaining if remaining is not None else 1.0)
            if self._fatal is not None:
                raise self._fatal
        return True

    def close(self, timeout: float | None = 30.0) -> bool:
        done = self.flush(timeout)
        with self._lock:
            self._closed = True
            self._outbox.put(_END)
            self._lock.notify_all()
        self._thread.join(timeout=5)
        return done

    # --- the delivery thread ------------------------------------------------------------------

    def _count_send(self, batch: Any) -> None:
        with self._lock:
            n = self._attempts.get(batch.sequence, 0) + 1
            self._attempts[batch.sequence] = n
            self.stats.sends += 1
            if n > 1:
                self.stats.resends += 1

    def _finish_attempts(self, sequence: int) -> None:
        n = self._attempts.pop(sequence, 0)
        self.stats.max_attempts = max(self.stats.max_attempts, n)

    def _requests(self, first: list[Any], outbox: queue.Queue[Any]) -> Iterator[Any]:
        for item in first:
            self._count_send(item)
            yield item
        while True:
            item = outbox.get()
            if item is _END:
                return
            self._count_send(item)
            yield item

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                self._outbox.put(_END)  # release the previous stream's generator, if any
                self._outbox = queue.Queue()
                resend = [self._unacked[s][0] for s in sorted(self._unacked)]
                # The batch that failed, while unacked; else the oldest. A batch before the
                # failed one may be unacked too (ingest drops the acks that finish after a
                # failure): its ack on this stream says nothing of the failing batch.
                failing = self._failing
                self._head = (
                    failing
                    if failing in self._unacked
                    else (min(self._unacked) if self._unacked else None)
                )
                now = time.monotonic()
                for s in self._unacked:
                    self._unacked[s] = (self._unacked[s][0], now)
                outbox = self._outbox
            call = self._stream(self._requests(resend, outbox), metadata=self.metadata)
            try:
                for ack in call:
                    if self._head is None or ack.sequence == self._head:
                        # The batch that failed got through: the next failure starts the
                        # backoff over. Acks of the others do not count.
                        self._failures = 0
                        self._failing = None
                    self._acked(ack)
                time.sleep(self.retry_delay)  # the server ended the stream: reopen it
            except grpc.RpcError as exc:
                refused = self._handle_error(exc)
                if refused is None:
                    return
                if refused:
                    time.sleep(min(self.retry_delay, 0.1))  # no failure: the rest flows on
                else:
                    self._backoff()

    def _backoff(self) -> None:
        """Wait before reconnecting: exponential in the consecutive failures, capped at
        `max_retry_delay`, with full jitter over its upper half (so a fleet of agents that lost
        ingest at the same moment does not come back in lockstep)."""
        ceiling = min(self.max_retry_delay, self.retry_delay * (2 ** min(self._failures, 30)))
        self._failures += 1
        delay = random.uniform(ceiling / 2, ceiling)  # noqa: S311 - reconnect jitter, not a secret
        self.backoff_delays = [*self.backoff_delays[-63:], delay]
        until = time.monotonic() + delay
        with self._lock:  # close() wakes us rather than waiting out a long backoff
            while not self._closed and (left := until - time.monotonic()) > 0:
                self._lock.wait(left)

    def _acked(self, ack: Any) -> None:
        with self._lock:
            entry = self._unacked.pop(ack.sequence, None)
            if entry is not None:
                self._finish_attempts(ack.sequence)
                self.stats.acked += 1
                if ack.rejected_records:
                    self._note_refused_records(ack)
                if ack.status == ingest_pb2.Ack.DUPLICATE:
                    self.stats.duplicates += 1
                if self.keep_latencies:
                    self.stats.ack_latencies.append(time.monotonic() - entry[1])
            self._lock.notify_all()
        if self.on_ack is not None:
            self.on_ack(ack)

    def _refuse(self, seq: int, details: str) -> bool:
        """The server refused batch `seq` for good: out of the window, to `on_reject`. False
        when no such batch is unacked."""
        refused: Any = None
        with self._lock:
            if seq in self._unacked:
                refused = self._unacked.pop(seq)[0]
                self._finish_attempts(seq)
                self.stats.rejected.append((seq, details))
                log.error("ingest rejected batch %s: %s", seq, details)
                self._lock.notify_all()
        if refused is None:
            return False
        if self.on_reject is not None:
            self.on_reject(seq, details, _serialize_batch(refused))
        return True

    def _batch_of_size(self, details: str) -> int | None:
        match = _TOO_LARGE.search(details)
        if match is None:
            return None
        size = int(match.group(1))
        with self._lock:
            for seq in sorted(self._unacked):
                if len(_serialize_batch(self._unacked[seq][0])) == size:
                    return seq
        return None

    def _note_refused_records(self, ack: Any) -> None:
        """Called with the lock held: count the records ingest refused alone; log it at most
        once per REFUSED_LOG_INTERVAL_S."""
        self.stats.records_refused += int(ack.rejected_records)
        self.stats.samples_refused += int(ack.rejected_samples)
        now = time.monotonic()
        if now - self._refused_logged_at < REFUSED_LOG_INTERVAL_S:
            return
        self._refused_logged_at = now
        first = ack.rejections[0] if ack.rejections else None
        log.warning(
            "ingest stored batch %s but refused %d of its records (%d samples)%s; "
            "%d refused since start",
            ack.sequence,
            ack.rejected_records,
            ack.rejected_samples,
            f": {first.message}" if first is not None else "",
            self.stats.records_refused,
        )

    def _handle_error(self, exc: grpc.RpcError) -> bool | None:
        """True: a batch was refused, reconnect at once; False: reconnect after the backoff;
        None: stop."""
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            seq = None
            for key, value in exc.trailing_metadata() or ():
                if key == REJECTED_SEQUENCE_KEY:
                    seq = int(value)
            if seq is None:  # not about one batch: resending would only repeat it
                with self._lock:
                    self._fatal = ValueError(f"ingest refused the stream: {details}")
                    self._lock.notify_all()
                return None
            if self._refuse(seq, str(details)):
                return True
            # A batch we no longer hold (or sequence 0: the server could not tell which):
            # reconnect after the backoff, never in a tight loop.
            log.warning("ingest refused a batch it did not name (%s): %s", seq, details)
            return False
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            # gRPC itself refused a message over the server's receive limit ("Received message
            # larger than max (N vs. M)"): the batch of N bytes would be refused every time.
            seq = self._batch_of_size(str(details))
            if seq is not None and self._refuse(
                seq, f"over the server's message size limit: {details}"
            ):
                return True
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            with self._lock:
                self._fatal = PermissionError(f"ingest refused the agent token: {details}")
                self._lock.notify_all()
            return None
        if self._closed:
            return None
        named = _NOT_STORED.search(str(details))
        self._failing = int(named.group(1)) if named else None
        self.stats.reconnects += 1
        log.warning("ingest stream broke (%s: %s); reconnecting", code, details)
        return False
