"""An in-test ingest server built from the contract's gRPC stubs (no Django): it acks what it
receives, remembers every send, and can be told to refuse or fail batches, or be stopped and
restarted on its port, so the agent's transport internals are tested against a real gRPC peer.
The real server (ingest/server.py) is what the end-to-end tests in tests/ drive the agent to."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from contract.wire import ingest_pb2, ingest_pb2_grpc
from contract.wire.client import REJECTED_SEQUENCE_KEY
from contract.wire.decode import batch_records

# (sequence, attempt, batch) -> a reason to refuse it for good (INVALID_ARGUMENT), or None
Refuse = Callable[[int, int, Any], str | None]
# (sequence, attempt, batch) -> True to fail it this time (UNAVAILABLE: resend it)
Fail = Callable[[int, int, Any], bool]


class FakeIngest:
    def __init__(
        self,
        *,
        max_batch_bytes: int = 32 * 1024 * 1024,
        refuse: Refuse | None = None,
        fail: Fail | None = None,
        max_message_bytes: int | None = None,
    ) -> None:
        self.max_batch_bytes = max_batch_bytes
        self.max_message_bytes = max_message_bytes
        self.refuse = refuse
        self.fail = fail
        self.port = 0
        self.registered: list[Any] = []  # RegisterRequest messages
        self.sends: Counter[int] = Counter()  # sequence -> times received
        self.stored: dict[int, list[dict[str, Any]]] = {}  # sequence -> its records
        self.failed_at: dict[int, list[float]] = {}  # sequence -> monotonic times it failed
        self._lock = threading.Lock()
        self._server: Any = None
        self.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        options = []
        if self.max_message_bytes:  # gRPC itself refuses bigger messages (RESOURCE_EXHAUSTED)
            options.append(("grpc.max_receive_message_length", self.max_message_bytes))
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=options)
        ingest_pb2_grpc.add_IngestServicer_to_server(_Servicer(self), server)
        port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        assert port and (self.port in (0, port)), port
        self.port = port
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
            self._server = None

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            out = [r for seq in sorted(self.stored) for r in self.stored[seq]]
        return [r for r in out if kind is None or r["type"] == kind]


class _Servicer(ingest_pb2_grpc.IngestServicer):  # type: ignore[misc]
    def __init__(self, owner: FakeIngest) -> None:
        self.owner = owner

    def Register(self, request: Any, context: Any) -> Any:
        owner = self.owner
        with owner._lock:
            owner.registered.append(request)
            last = max(owner.stored, default=0)
        return ingest_pb2.RegisterResponse(
            session_id="fake",
            last_sequence=last,
            server_time_ms=int(time.time() * 1000),
            max_batch_bytes=owner.max_batch_bytes,
        )

    def Stream(self, request_iterator: Any, context: Any) -> Any:
        owner = self.owner
        for batch in request_iterator:
            seq = int(batch.sequence)
            with owner._lock:
                owner.sends[seq] += 1
                attempt = owner.sends[seq]
                duplicate = seq in owner.stored
            reason = owner.refuse(seq, attempt, batch) if owner.refuse and not duplicate else None
            if reason is not None:
                context.set_trailing_metadata(((REJECTED_SEQUENCE_KEY, str(seq)),))
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"batch {seq} rejected: {reason}")
            if owner.fail is not None and not duplicate and owner.fail(seq, attempt, batch):
                with owner._lock:
                    owner.failed_at.setdefault(seq, []).append(time.monotonic())
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"batch {seq} could not be stored (test); resend it and the unacked "
                    "batches after it",
                )
            records = batch_records(batch.SerializeToString())
            samples = sum(1 for r in records if r["type"] == "sample")
            with owner._lock:
                owner.stored.setdefault(seq, records)
            status = ingest_pb2.Ack.DUPLICATE if duplicate else ingest_pb2.Ack.STORED
            yield ingest_pb2.Ack(sequence=seq, status=status, samples=samples)
