"""The ingest gRPC server: authenticates, decodes, queues; storage is services.store_batch().

Flow of one stream:
    reader thread: pull a Batch from the stream → decode_batch() → put on the bounded write
        queue (blocks when full: the reader stops pulling, so gRPC/HTTP2 flow control pushes
        back to the agent, whose sends block — agents see the slowdown as delayed acks)
    writer threads: store_batch() in one transaction → on commit, hand the Ack back
    handler generator: yield each Ack as it arrives
An Ack is only ever sent after its batch committed, and a batch that failed to store is never
acked (the stream ends with UNAVAILABLE and the agent resends it on a new stream). An invalid
batch ends the stream with INVALID_ARGUMENT after the acks of the batches before it; so does a
batch whose storage the database refused for its data (DataError, a check violation): resending
it would fail the same way, so the agent keeps it aside (its dead letter) instead. A record
that breaks a limit is refused alone (ingest.processing): the rest of its batch is stored, the
Ack counts and names what was refused, the reject metric counts it, and it is logged once (per
agent and reason, at most once a minute).
"""

from __future__ import annotations

import ipaddress
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from django.db import (
    DataError,
    IntegrityError,
    OperationalError,
    close_old_connections,
    connections,
)
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from contract import limits as L
from contract.wire import ingest_pb2, ingest_pb2_grpc
from ingest import metrics, server_wire, services
from ingest.processing import (
    BatchRejected,
    DecodedBatch,
    Limits,
    RegisterRefused,
    check_register,
    decode_batch,
)
from tenants.services import resolve_agent_token, resolve_agent_token_ids

log = logging.getLogger(__name__)

SERVICE_NAME = "proof.ingest.v1.Ingest"
REJECTED_SEQUENCE_KEY = "proof-rejected-sequence"
# How often an open stream re-checks its agent token (one indexed lookup per stream per
# interval): a revoked token stops being honoured within this many seconds.
TOKEN_RECHECK_S = 10.0
# Refused records are logged at most once per (agent id, reason) per this many seconds; the
# metric counts every one.
REJECT_LOG_INTERVAL_S = 60.0
ACK_REJECTIONS = 8  # refused records named in one Ack (all are counted)
_STATUS = {
    services.StoreStatus.STORED: ingest_pb2.Ack.STORED,
    services.StoreStatus.DUPLICATE: ingest_pb2.Ack.DUPLICATE,
}


# A batch whose transaction PostgreSQL aborted for a conflict with a concurrent one (a deadlock,
# a serialization failure) is stored again by the same writer, up to this many attempts in all,
# after a short jittered wait; then it is not acked, as any other storage failure.
STORE_ATTEMPTS = 3
STORE_RETRY_WAIT_S = 0.05  # the wait before attempt n is up to n × this, uniformly jittered
# SQLSTATEs of a transaction aborted only for its timing against another: 40P01
# deadlock_detected, 40001 serialization_failure.
_CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})


def _conflict(exc: BaseException) -> bool:
    """The transaction lost a race with a concurrent one; running it again can succeed."""
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) in _CONFLICT_SQLSTATES


class PermanentStoreError(Exception):
    """The database refused the batch for what it holds; storing it again would fail again."""


def _permanent(exc: BaseException) -> bool:
    """A store failure caused by the batch's data (a value PostgreSQL refuses, a constraint),
    not by the database being unavailable: DataError, and IntegrityError other than a foreign
    key (a row deleted under us, which a retry after the caches are dropped can get past)."""
    if isinstance(exc, DataError):
        return True
    if isinstance(exc, IntegrityError):
        return "foreign key" not in str(exc).lower()
    return False


class _RejectLog:
    """Log refused records once per (agent, reason) per interval, with how many since."""

    def __init__(self, interval_s: float = REJECT_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def note(self, batch: DecodedBatch) -> None:
        now = time.monotonic()
        by_reason: dict[str, int] = {}
        for (_kind, reason), n in batch.rejected_by.items():
            by_reason[reason] = by_reason.get(reason, 0) + n
        for reason, n in sorted(by_reason.items()):
            key = (batch.agent_id, reason)
            with self._lock:
                if len(self._last) > 10_000:
                    self._last.clear()
                last, quiet = self._last.get(key, (-1e18, 0))
                due = now - last >= self.interval_s
                self._last[key] = (now, 0) if due else (last, quiet + n)
            if not due:
                continue
            example = next((r for r in batch.rejections if r.reason == reason), None)
            log.warning(
                "batch %s of agent %s: %d record(s) refused (%s), the rest stored; e.g. %s%s",
                batch.sequence,
                batch.agent_id,
                n,
                reason,
                example if example is not None else "?",
                f" ({quiet} more of this agent and reason not logged since)" if quiet else "",
            )


def _ack(seq: int, status: Any, samples: int, batch: DecodedBatch | None) -> Any:
    ack = ingest_pb2.Ack(sequence=seq, status=status, samples=samples)
    if batch is not None and batch.rejected_records:
        ack.rejected_records = batch.rejected_records
        ack.rejected_samples = batch.rejected_samples
        for r in batch.rejections[:ACK_REJECTIONS]:
            ack.rejections.add(
                kind=r.kind,
                index=r.index,
                reason=r.reason,
                message=L.clean_text(r.message, 512),
            )
    return ack


@dataclass
class WriteItem:
    operator_id: int
    batch: DecodedBatch
    arrived: float
    done: Callable[[services.StoreOutcome | None, BaseException | None], None]


class StorageWriter:
    """A bounded queue drained by `threads` writer threads, each on its own DB connection."""

    def __init__(self, depth: int, threads: int) -> None:
        self.queue: queue.Queue[WriteItem | None] = queue.Queue(maxsize=depth)
        self.threads = [
            threading.Thread(target=self._run, name=f"ingest-writer-{i}", daemon=True)
            for i in range(threads)
        ]
        metrics.QUEUE_DEPTH.set_function(self.queue.qsize)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def submit(self, item: WriteItem) -> None:
        self.queue.put(item)  # blocks while the queue is full: that is the backpressure

    def stop(self) -> None:
        """Finish what is queued, then stop the threads."""
        for _ in self.threads:
            self.queue.put(None)
        for thread in self.threads:
            thread.join()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                connections.close_all()
                return
            try:
                outcome = self._store(item)
            except BaseException as exc:
                # One line per failure; the traceback only at debug level (a batch that keeps
                # failing must not fill the log with tracebacks).
                permanent = _permanent(exc)
                first_line = L.clean_text((str(exc).strip() or "?").splitlines()[0], 300)
                log.error(
                    "storing batch %s of %s failed (%s: %s); %s",
                    item.batch.sequence,
                    item.batch.agent_id,
                    type(exc).__name__,
                    first_line,
                    "refused: its data cannot be stored" if permanent else "not acked",
                )
                log.debug("storing batch %s failed", item.batch.sequence, exc_info=True)
                metrics.STORE_ERRORS.inc()
                close_old_connections()
                if permanent:
                    metrics.REJECTS.labels("store_refused").inc()
                    exc = PermanentStoreError(
                        f"the database refused its data ({type(exc).__name__}: {first_line})"
                    )
                item.done(None, exc)
                continue
            metrics.BATCHES.labels(outcome.status.value).inc()
            if outcome.status is services.StoreStatus.STORED:
                metrics.SAMPLES.inc(outcome.samples)
                batch = item.batch
                metrics.RECORDS.inc(
                    len(batch.logs)
                    + len(batch.events)
                    + len(batch.processes)
                    + len(batch.exits)
                    + len(batch.jobs)
                )
            item.done(outcome, None)

    @staticmethod
    def _store(item: WriteItem) -> services.StoreOutcome:
        """store_batch(), run again (a bounded number of times) when its transaction was
        aborted for a conflict with a concurrent batch. Nothing of an aborted attempt stays:
        the whole batch, receipt included, was rolled back, and the id caches publish only on
        commit, so the next attempt stores it exactly as the first would have."""
        for attempt in range(1, STORE_ATTEMPTS + 1):
            try:
                return services.store_batch(item.operator_id, item.batch)
            except OperationalError as exc:
                if attempt == STORE_ATTEMPTS or not _conflict(exc):
                    raise
                metrics.STORE_RETRIES.inc()
                log.info(
                    "storing batch %s of %s: %s; attempt %d of %d",
                    item.batch.sequence,
                    item.batch.agent_id,
                    L.clean_text((str(exc).strip() or "?").splitlines()[0], 300),
                    attempt + 1,
                    STORE_ATTEMPTS,
                )
                time.sleep(random.uniform(0, attempt * STORE_RETRY_WAIT_S))  # noqa: S311
        raise AssertionError("unreachable")


def _parse_batch(raw: bytes, limits: Limits) -> Any:
    """Parse the wire bytes ourselves (the Stream method has no deserializer), so that bytes
    that are not a Batch are an INVALID_ARGUMENT naming the problem like any other bad batch."""
    try:
        # Parsed even when over the limit (gRPC's own receive limit bounds it, at twice ours),
        # so that the refusal names the batch's sequence and the agent can set that one aside.
        # The server's view of a Batch (ingest.server_wire): its packed samples stay bytes.
        batch = server_wire.parse(raw)
    except DecodeError as exc:
        raise BatchRejected("malformed", f"the message is not a valid Batch: {exc}") from None
    if len(raw) > limits.max_batch_bytes:
        raise _Oversized(
            int(batch.sequence),
            f"batch is {len(raw)} bytes, over the limit of {limits.max_batch_bytes}",
        )
    return batch


def _parse_register(raw: bytes) -> Any:
    try:
        return ingest_pb2.RegisterRequest.FromString(raw)
    except DecodeError:
        raise RegisterRefused(
            "request",
            "the message is not a valid RegisterRequest (e.g. a string field that is not UTF-8)",
        ) from None


class _Oversized(BatchRejected):
    def __init__(self, sequence: int, message: str) -> None:
        super().__init__("oversized", message)
        self.sequence = sequence


def service_handler(servicer: IngestServicer) -> grpc.GenericRpcHandler:
    """The Ingest service, with Stream taking raw bytes (see _parse_batch)."""
    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            # Parsed by the servicer too: bytes that are not a RegisterRequest (a string that
            # is not UTF-8) are INVALID_ARGUMENT saying so, not gRPC's INTERNAL.
            "Register": grpc.unary_unary_rpc_method_handler(
                servicer.Register,
                response_serializer=ingest_pb2.RegisterResponse.SerializeToString,
            ),
            "Stream": grpc.stream_stream_rpc_method_handler(
                servicer.Stream, response_serializer=ingest_pb2.Ack.SerializeToString
            ),
        },
    )


def _bearer(context: grpc.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :].strip()
    return ""


# The generated base is untyped (contract/wire/ingest_pb2_grpc.py, skipped by mypy).
class IngestServicer(ingest_pb2_grpc.IngestServicer):  # type: ignore[misc]
    """Decodes and authenticates only; processing is plain functions."""

    def __init__(
        self, writer: StorageWriter, limits: Limits, token_recheck_s: float = TOKEN_RECHECK_S
    ) -> None:
        self.writer = writer
        self.limits = limits
        self.token_recheck_s = token_recheck_s
        self._recheck_lock = threading.Lock()
        self._rechecked: dict[str, tuple[int | None, float]] = {}
        self._reject_log = _RejectLog()

    @staticmethod
    def _resolve(token: str) -> int | None:
        try:
            return resolve_agent_token(token) if token else None
        finally:
            # RPC threads come from a pool; do not leave a connection parked on each.
            connections.close_all()

    def _recheck(self, token: str) -> int | None:
        """`_resolve` for open streams, shared by the streams of one token for half the
        re-check interval (many agents often share a token): a revocation is seen within 1.5
        intervals, with one lookup per token, not per stream, per half interval."""
        now = time.monotonic()
        with self._recheck_lock:
            cached = self._rechecked.get(token)
        if cached is not None and now - cached[1] < self.token_recheck_s / 2:
            return cached[0]
        operator_id = self._resolve(token)
        with self._recheck_lock:
            if len(self._rechecked) > 10_000:
                self._rechecked.clear()
            self._rechecked[token] = (operator_id, now)
        return operator_id

    @staticmethod
    def _refuse(context: grpc.ServicerContext) -> None:
        metrics.AUTH_FAILURES.inc()
        context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing, unknown or revoked agent token (send 'authorization: Bearer <token>')",
        )

    def _authenticate(self, context: grpc.ServicerContext) -> int:
        operator_id = self._resolve(_bearer(context))
        if operator_id is None:
            self._refuse(context)
        return int(operator_id)  # type: ignore[arg-type]

    def Register(self, raw: bytes, context: grpc.ServicerContext) -> Any:
        # The token's id too: the node records which token its agent registered with.
        try:
            ids = resolve_agent_token_ids(_bearer(context))
        finally:
            connections.close_all()
        if ids is None:
            self._refuse(context)
        operator_id, token_id = ids  # type: ignore[misc]
        try:
            request = _parse_register(raw)
            check_register(request)
        except RegisterRefused as exc:
            metrics.REJECTS.labels("register_refused").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        # Cleaned exactly as the agent cleans the same values in its records (contract/limits.py),
        # so the node and GPU ids of Register match those of the batches.
        gpus = [
            {
                "uuid": L.clean_identifier(g.uuid, L.MAX_GPU_CHARS),
                "index": g.index,
                "model": L.clean_text(g.model, 128),
                "memory_mib": g.memory_mib if 0 < g.memory_mib < 2**63 else None,
                "driver_version": L.clean_text(g.driver_version, 64),
                "cuda_version": L.clean_text(g.cuda_version, 64),
            }
            for g in request.gpus
            if g.uuid
        ]
        try:
            session, last = services.register_agent(
                operator_id,
                agent_id=L.clean_identifier(request.agent_id, L.MAX_AGENT_ID_CHARS),
                hostname=L.clean_identifier(request.hostname, L.MAX_NODE_CHARS),
                agent_version=L.clean_text(request.agent_version, 64),
                gpus=gpus,
                agent_token_id=token_id,
            )
        finally:
            connections.close_all()
        return ingest_pb2.RegisterResponse(
            session_id=session,
            last_sequence=last,
            server_time_ms=int(time.time() * 1000),
            max_batch_bytes=self.limits.max_batch_bytes,
        )

    def Stream(
        self, request_iterator: Iterator[Any], context: grpc.ServicerContext
    ) -> Iterator[Any]:
        operator_id = self._authenticate(context)
        token = _bearer(context)
        events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        context.add_callback(lambda: events.put(("cancelled",)))
        stop_reading = threading.Event()

        def on_done(batch: DecodedBatch, arrived: float) -> Callable[..., None]:
            seq = batch.sequence

            def done(outcome: services.StoreOutcome | None, exc: BaseException | None) -> None:
                if isinstance(exc, PermanentStoreError):
                    events.put(("refused", seq, str(exc)))
                elif exc is not None:
                    events.put(("error", seq, exc))
                elif outcome is None:  # cannot be: the writer gives an outcome or an error
                    events.put(("error", seq, RuntimeError("no outcome and no error")))
                else:
                    ack = _ack(seq, _STATUS[outcome.status], batch.sample_count, batch)
                    events.put(("ack", ack, arrived))

            return done

        def read() -> None:
            checked = time.monotonic()
            # The batch read and not yet handed on (its sequence once parsed; 0 before), and
            # whether its "queued" was counted: an error while one is in hand must end the
            # stream unavailable, never OK without its ack.
            in_hand: int | None = None
            counted = False
            try:
                for raw in request_iterator:
                    in_hand, counted = 0, False
                    arrived = time.monotonic()
                    if stop_reading.is_set():
                        break
                    if arrived - checked >= self.token_recheck_s:
                        # A token revoked while its stream is open cuts the stream off: no
                        # batch after the revocation is seen is stored.
                        if self._recheck(token) != operator_id:
                            metrics.AUTH_FAILURES.inc()
                            events.put(("revoked",))
                            return
                        checked = arrived
                    sequence = 0
                    try:
                        batch = _parse_batch(raw, self.limits)
                        sequence = in_hand = int(batch.sequence)
                        decoded = decode_batch(batch, self.limits, size=len(raw))
                    except BatchRejected as exc:
                        sequence = getattr(exc, "sequence", sequence)
                        metrics.REJECTS.labels(exc.reason).inc()
                        events.put(("reject", sequence, exc.message))
                        return
                    except Exception as exc:  # a decoder bug must not become a resend loop
                        log.error(
                            "batch %s could not be decoded (%s: %s); refused",
                            sequence,
                            type(exc).__name__,
                            exc,
                        )
                        log.debug("decoding batch %s failed", sequence, exc_info=True)
                        metrics.REJECTS.labels("undecodable").inc()
                        events.put(
                            (
                                "reject",
                                sequence,
                                f"could not be decoded ({type(exc).__name__}: "
                                f"{L.clean_text(str(exc), 200)})",
                            )
                        )
                        return
                    if decoded.rejected_records:
                        for (kind, reason), n in decoded.rejected_by.items():
                            metrics.RECORD_REJECTS.labels(kind, reason).inc(n)
                        metrics.REJECTED_SAMPLES.inc(decoded.rejected_samples)
                        self._reject_log.note(decoded)
                    events.put(("queued",))
                    counted = True
                    self.writer.submit(
                        WriteItem(operator_id, decoded, arrived, on_done(decoded, arrived))
                    )
                    in_hand = None
            except Exception as exc:
                if in_hand is None:
                    log.debug("stream ended: %s", exc)
                else:
                    log.error(
                        "batch %s could not be queued (%s: %s); the stream ends unavailable",
                        in_hand or "?",
                        type(exc).__name__,
                        L.clean_text(str(exc), 200),
                    )
                    events.put(("lost", in_hand, exc, counted))
            finally:
                events.put(("end",))

        metrics.STREAMS.inc()
        reader = threading.Thread(target=read, name="ingest-stream-reader", daemon=True)
        reader.start()
        pending, ended = 0, False
        rejection: tuple[int, str] | None = None
        revoked = False
        failure: tuple[int, BaseException] | None = None
        store_refused = False
        try:
            while not ((ended or failure is not None or store_refused) and pending == 0):
                try:
                    event = events.get(timeout=1.0)
                except queue.Empty:
                    # gRPC can end a call by itself (a request it could not deserialize, a
                    # deadline) without waking us: notice it, or the handler thread leaks.
                    if not context.is_active():
                        stop_reading.set()
                        return
                    continue
                kind = event[0]
                if kind == "queued":
                    pending += 1
                elif kind == "ack":
                    _, ack, arrived = event
                    pending -= 1
                    metrics.ACK_LATENCY.observe(time.monotonic() - arrived)
                    if failure is None:
                        yield ack
                elif kind == "refused":
                    # Stored nothing and never will: refuse it like an invalid batch (the
                    # agent sets it aside); the batches before it are acked as they finish.
                    pending -= 1
                    stop_reading.set()
                    store_refused = True
                    if rejection is None or event[1] < rejection[0]:
                        rejection = (event[1], event[2])
                elif kind == "error":
                    pending -= 1
                    stop_reading.set()
                    failure = failure or (event[1], event[2])
                elif kind == "lost":
                    pending -= 1 if event[3] else 0
                    stop_reading.set()
                    failure = failure or (event[1], event[2])
                elif kind == "reject":
                    rejection = (event[1], event[2])
                elif kind == "revoked":
                    revoked = True
                elif kind == "end":
                    ended = True
                elif kind == "cancelled":
                    stop_reading.set()
                    return
        finally:
            metrics.STREAMS.dec()
        if failure is not None:
            which = f"batch {failure[0]}" if failure[0] else "a batch it read"
            context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"{which} could not be stored ({type(failure[1]).__name__}); "
                "resend it and the unacked batches after it",
            )
        if revoked:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "agent token revoked: the stream is closed and nothing after this is stored",
            )
        if rejection is not None:
            context.set_trailing_metadata(((REJECTED_SEQUENCE_KEY, str(rejection[0])),))
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"batch {rejection[0]} rejected: {rejection[1]}"
            )


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class InsecureBindRefused(ValueError):
    pass


class IngestServer:
    """The gRPC server with its writer threads and health service."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        insecure: bool = False,
        writers: int = 2,
        queue_depth: int = 64,
        max_streams: int = 512,
        limits: Limits | None = None,
        token_recheck_s: float = TOKEN_RECHECK_S,
    ) -> None:
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("TLS needs both a certificate and a key")
        if tls_cert is None and not insecure and not is_loopback(host):
            raise InsecureBindRefused(
                f"refusing plaintext gRPC on {host}: configure PROOF_INGEST_TLS_CERT/KEY "
                "(or --tls-cert/--tls-key), bind to loopback, or pass --insecure when a proxy "
                "terminates TLS in front of this server"
            )
        self.limits = limits or Limits.from_settings()
        if connections["default"].vendor == "sqlite":
            writers = 1  # SQLite takes one writer at a time: more threads only contend
        self.writer = StorageWriter(queue_depth, writers)
        self.health = health.HealthServicer()
        self.server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=max_streams + 16, thread_name_prefix="ingest-rpc"
            ),
            maximum_concurrent_rpcs=max_streams,
            options=[
                ("grpc.max_receive_message_length", self.limits.max_batch_bytes * 2),
                ("grpc.so_reuseport", 1),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ],
        )
        self.server.add_generic_rpc_handlers(
            (service_handler(IngestServicer(self.writer, self.limits, token_recheck_s)),)
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        address = f"{host}:{port}"
        self.port: int
        if tls_cert is not None and tls_key is not None:
            with open(tls_key, "rb") as key, open(tls_cert, "rb") as cert:
                creds = grpc.ssl_server_credentials([(key.read(), cert.read())])
            self.port = self.server.add_secure_port(address, creds)
        else:
            self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"could not bind the ingest server to {address}")

    def start(self) -> int:
        self.writer.start()
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self.port

    def stop(self, grace: float | None = 5.0) -> None:
        """Stop taking calls, let streams finish for `grace` seconds, then store what is queued."""
        self.health.enter_graceful_shutdown()
        # Bounded wait: a call gRPC itself failed may never report done (seen in grpcio 1.8x).
        self.server.stop(grace).wait(timeout=(grace or 0) + 10)
        self.writer.stop()

    def wait(self) -> None:
        self.server.wait_for_termination()
