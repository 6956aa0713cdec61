"""BatchSender's backoff against a scripted gRPC peer: what ingest does with two writers when a
batch fails to store while the batch before it is still being written — the ack of that
earlier batch is dropped with the stream (ingest sends no ack after a failure), so the earlier
batch is resent, and acked, on the next stream. That ack says nothing of the failing batch:
the backoff must keep growing until the failing batch itself is stored."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from contract.wire import ingest_pb2, ingest_pb2_grpc
from contract.wire.client import BatchSender, open_channel

FAILING = 2  # fails to store on its first FAILURES sends
FAILURES = 3


class _Writers(ingest_pb2_grpc.IngestServicer):  # type: ignore[misc]
    """Batch 1 is stored slowly: on its first send the failure of batch 2 ends the stream
    before its ack; batch 2 fails FAILURES times, then is stored."""

    def __init__(self) -> None:
        self.sends: Counter[int] = Counter()
        self.lock = threading.Lock()

    def Stream(self, request_iterator: Iterator[Any], context: Any) -> Iterator[Any]:
        for batch in request_iterator:
            seq = int(batch.sequence)
            with self.lock:
                self.sends[seq] += 1
                attempt = self.sends[seq]
            if seq == FAILING and attempt <= FAILURES:
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"batch {seq} could not be stored (OperationalError); resend it and the "
                    "unacked batches after it",
                )
            if seq == 1 and attempt == 1:
                continue  # still being written when batch 2 fails: no ack on this stream
            status = ingest_pb2.Ack.DUPLICATE if seq == 1 else ingest_pb2.Ack.STORED
            yield ingest_pb2.Ack(sequence=seq, status=status)


@pytest.fixture
def peer() -> Iterator[tuple[str, _Writers]]:
    servicer = _Writers()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    ingest_pb2_grpc.add_IngestServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(grace=0.5).wait()


def test_the_ack_of_an_earlier_batch_does_not_reset_the_backoff_of_a_failing_one(
    peer: tuple[str, _Writers],
) -> None:
    address, servicer = peer
    base = 0.1
    sender = BatchSender(open_channel(address), "token", retry_delay=base, max_retry_delay=60)
    try:
        for seq in (1, 2):
            sender.send(ingest_pb2.Batch(agent_id="a", sequence=seq))
        assert sender.flush(timeout=30)
    finally:
        sender.close(timeout=5)
    assert servicer.sends == {1: 2, FAILING: FAILURES + 1}
    assert sender.stats.reconnects == FAILURES and sender.stats.acked == 2
    delays = sender.backoff_delays
    assert len(delays) == FAILURES
    # Before, the resent batch 1's ack on the second stream reset the backoff: the second wait
    # was drawn from [base/2, base] again instead of [base, 2 * base].
    for k, delay in enumerate(delays):  # jittered over the upper half of base * 2^k
        assert base * 2**k / 2 <= delay <= base * 2**k, (k, delays)
