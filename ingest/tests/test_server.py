"""The real gRPC server on 127.0.0.1 (ephemeral port) with the agent's real client.

The server's writer threads use their own database connections, so these tests commit for
real (transaction=True) and scope every check to operators they create.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from django.db import connection
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from contract.wire import ingest_pb2, ingest_pb2_grpc
from contract.wire.client import BatchSender, open_channel
from ingest import selectors, services
from ingest.models import BatchReceipt, Gpu, Node
from ingest.processing import Limits
from ingest.server import IngestServer, IngestServicer
from ingest.storage import BLOCK_TABLE
from ingest.tests.helpers import gpu_batch
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server() -> Iterator[IngestServer]:
    services.clear_caches()
    srv = IngestServer("127.0.0.1", 0, writers=2, queue_depth=8)
    srv.start()
    yield srv
    srv.stop(grace=1)


def token_for(operator_id: int) -> str:
    return tenant_services.do_create_agent_token(operator_id, name="agent")[1]


def stored_samples(operator_id: int) -> int:
    where = "" if connection.vendor == "postgresql" else f" WHERE operator_id = {operator_id:d}"
    with tenant_context(operator_id), connection.cursor() as cursor:
        cursor.execute(f"SELECT coalesce(sum(sample_count), 0) FROM {BLOCK_TABLE}{where}")
        return int(cursor.fetchone()[0])


def receipts(operator_id: int, agent_id: str) -> list[int]:
    with tenant_context(operator_id):
        return sorted(
            BatchReceipt.objects.for_tenant(operator_id)
            .filter(agent_id=agent_id)
            .values_list("sequence", flat=True)
        )


def stream_once(
    port: int, token: str, batches: list[Any]
) -> tuple[list[Any], grpc.RpcError | None]:
    """Send `batches` on one stream; the acks received and the error that ended it, if any."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = ingest_pb2_grpc.IngestStub(channel)
        acks: list[Any] = []
        try:
            for ack in stub.Stream(iter(batches), metadata=(("authorization", f"Bearer {token}"),)):
                acks.append(ack)
        except grpc.RpcError as exc:
            return acks, exc
        return acks, None


def test_unknown_and_revoked_tokens_are_refused(server: IngestServer) -> None:
    tenant = make_tenant("srv-auth")
    token, plaintext = tenant_services.do_create_agent_token(tenant.operator.pk, name="n1")
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = ingest_pb2_grpc.IngestStub(channel)
        request = ingest_pb2.RegisterRequest(agent_id="a", hostname="h")
        for metadata in ((), (("authorization", "Bearer prfa_nope"),)):
            with pytest.raises(grpc.RpcError) as info:
                stub.Register(request, metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stub.Register(request, metadata=(("authorization", f"Bearer {plaintext}"),))
        with tenant_context(tenant.operator.pk):  # the node records the token it came with
            assert Node.objects.for_tenant(tenant.operator.pk).get(hostname="h").agent_token_id == (
                token.pk
            )
        tenant_services.do_revoke_agent_token(tenant.principal(tenant.operator_admin), token.pk)
        with pytest.raises(grpc.RpcError) as info:
            stub.Register(request, metadata=(("authorization", f"Bearer {plaintext}"),))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    acks, error = stream_once(server.port, plaintext, [gpu_batch()])
    assert acks == [] and error is not None
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert stored_samples(tenant.operator.pk) == 0


def test_register_records_node_and_gpus(server: IngestServer) -> None:
    tenant = make_tenant("srv-reg")
    sender = BatchSender(open_channel(f"127.0.0.1:{server.port}"), token_for(tenant.operator.pk))
    response = sender.register(
        agent_id="agent-r",
        hostname="gpu-node-7",
        agent_version="0.1.0",
        gpus=[
            {
                "uuid": "GPU-aaa",
                "index": 0,
                "model": "H100",
                "memory_mib": 81559,
                "driver_version": "550.54",
                "cuda_version": "12.4",
            }
        ],
    )
    assert response.last_sequence == 0 and response.max_batch_bytes > 0
    inventory = selectors.node_inventory(tenant.operator.pk, "gpu-node-7")
    assert inventory is not None and inventory["gpus"][0]["model"] == "H100"
    sender.send(gpu_batch(agent_id="agent-r", sequence=1))
    assert sender.flush(timeout=30)
    sender.close()
    again = BatchSender(open_channel(f"127.0.0.1:{server.port}"), token_for(tenant.operator.pk))
    assert (
        again.register(
            agent_id="agent-r", hostname="gpu-node-7", agent_version="0.1.0"
        ).last_sequence
        == 1
    )
    again.close()
    with tenant_context(tenant.operator.pk):
        # Registering again adds no second row; the batch's own GPUs (of node-a, which never
        # registered) are in the inventory from their samples.
        gpus = Gpu.objects.for_tenant(tenant.operator.pk)
        assert list(gpus.filter(node__hostname="gpu-node-7").values_list("uuid", flat=True)) == [
            "GPU-aaa"
        ]
        assert set(gpus.exclude(node__hostname="gpu-node-7").values_list("uuid", flat=True)) == {
            "GPU-node-a-0",
            "GPU-node-a-1",
        }


def test_operator_a_agent_cannot_write_into_operator_b(server: IngestServer) -> None:
    a, b = make_tenant("srv-iso-a"), make_tenant("srv-iso-b")
    token_b = token_for(b.operator.pk)
    acks, error = stream_once(server.port, token_b, [gpu_batch(agent_id="b-agent", node="n1")])
    assert error is None and [x.status for x in acks] == [ingest_pb2.Ack.STORED]
    before_b = stored_samples(b.operator.pk)
    # A's agent sends the very same identities, agent id and sequence as B's: the tenant comes
    # from A's token alone, so it all lands in A.
    acks, error = stream_once(
        server.port, token_for(a.operator.pk), [gpu_batch(agent_id="b-agent", node="n1")]
    )
    assert error is None and [x.status for x in acks] == [ingest_pb2.Ack.STORED]
    assert stored_samples(b.operator.pk) == before_b == 40
    assert stored_samples(a.operator.pk) == 40
    assert receipts(b.operator.pk, "b-agent") == [1] and receipts(a.operator.pk, "b-agent") == [1]


def test_a_bad_record_is_refused_alone_and_an_unusable_batch_whole(
    server: IngestServer,
) -> None:
    tenant = make_tenant("srv-bad")
    token = token_for(tenant.operator.pk)
    good = gpu_batch(agent_id="ag", sequence=1)
    bad = gpu_batch(agent_id="ag", sequence=2)
    bad.values[3] = float("nan")
    acks, error = stream_once(server.port, token, [good, bad, gpu_batch(agent_id="ag", sequence=3)])
    assert error is None
    acks = sorted(acks, key=lambda a: a.sequence)  # two writers: acks may come out of order
    assert [a.sequence for a in acks] == [1, 2, 3]
    assert [a.rejected_records for a in acks] == [0, 1, 0]
    assert acks[1].rejected_samples == 1 and acks[1].samples == 39
    refused = acks[1].rejections[0]
    assert (refused.kind, refused.index, refused.reason) == ("samples", 0, "non_finite")
    assert "not finite" in refused.message
    future = gpu_batch(agent_id="ag", sequence=4, start=time.time() + 86400)
    acks, error = stream_once(server.port, token, [future])
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "batch 4 rejected" in error.details() and "outside the accepted window" in error.details()
    )
    garbage_stub_error = None
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        raw = channel.stream_stream("/proof.ingest.v1.Ingest/Stream")
        try:
            list(
                raw(
                    iter([b"\xff\xff\xff garbage"]),
                    metadata=(("authorization", f"Bearer {token}"),),
                )
            )
        except grpc.RpcError as exc:
            garbage_stub_error = exc
    assert garbage_stub_error is not None
    assert garbage_stub_error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid Batch" in (garbage_stub_error.details() or "")
    assert receipts(tenant.operator.pk, "ag") == [1, 2, 3]
    assert stored_samples(tenant.operator.pk) == 40 + 39 + 40
    refused_metric = REGISTRY.get_sample_value(
        "proof_ingest_record_rejects_total", {"kind": "samples", "reason": "non_finite"}
    )
    assert refused_metric is not None and refused_metric >= 1
    rejects = REGISTRY.get_sample_value("proof_ingest_rejects_total", {"reason": "out_of_window"})
    assert rejects is not None and rejects >= 1


def test_health_service_reports_serving(server: IngestServer) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "proof.ingest.v1.Ingest"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_server_restarted_mid_stream_loses_nothing_that_was_acked() -> None:
    services.clear_caches()
    tenant = make_tenant("srv-restart")
    token = token_for(tenant.operator.pk)
    first = IngestServer("127.0.0.1", 0, writers=2, queue_depth=4)
    port = first.start()
    acked: list[int] = []
    lock = threading.Lock()

    def on_ack(ack: Any) -> None:
        with lock:
            acked.append(ack.sequence)

    sender = BatchSender(
        open_channel(f"127.0.0.1:{port}"), token, window=4, retry_delay=0.2, on_ack=on_ack
    )
    total = 40
    start = float(int(time.time()) - 3600)
    batches = [
        gpu_batch(agent_id="rs", sequence=i, start=start + 10 * (i - 1), gpus=4)
        for i in range(1, total + 1)
    ]
    second: IngestServer | None = None
    for batch in batches:
        sender.send(batch, timeout=60)
        if batch.sequence == 15:
            # Stop the server with batches in flight, then start a new one on the same port.
            first.stop(grace=0)
            with lock:
                acked_before_restart = list(acked)
            assert acked_before_restart, "some batches should have been acked before the restart"
            assert set(receipts(tenant.operator.pk, "rs")) >= set(acked_before_restart)
            second = IngestServer("127.0.0.1", port, writers=2, queue_depth=4)
            second.start()
    assert sender.flush(timeout=60)
    sender.close()
    assert second is not None
    second.stop(grace=1)
    assert sender.stats.reconnects >= 1
    assert sorted(set(acked)) == list(range(1, total + 1))
    assert receipts(tenant.operator.pk, "rs") == list(range(1, total + 1))
    # every sample exactly once, whatever was resent
    assert stored_samples(tenant.operator.pk) == total * 4 * 2 * 10
    data = selectors.node_series(tenant.operator.pk, "node-a", start - 1, start + 10 * total)
    assert len(data) == 8
    for series in data:
        assert len(series.ts) == 10 * total
        assert np.all(np.diff(series.ts) == 1.0)


def test_token_revoked_mid_stream_cuts_the_open_stream_off() -> None:
    services.clear_caches()
    srv = IngestServer("127.0.0.1", 0, writers=1, queue_depth=8, token_recheck_s=0.0)
    srv.start()
    try:
        tenant = make_tenant("srv-revoke-live")
        token, plaintext = tenant_services.do_create_agent_token(tenant.operator.pk, name="n")
        first_acked = threading.Event()

        def batches() -> Iterator[Any]:
            yield gpu_batch(agent_id="rv", sequence=1)
            assert first_acked.wait(30)
            yield gpu_batch(agent_id="rv", sequence=2)
            yield gpu_batch(agent_id="rv", sequence=3)

        acks: list[Any] = []
        error: grpc.RpcError | None = None
        with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
            stub = ingest_pb2_grpc.IngestStub(channel)
            metadata = (("authorization", f"Bearer {plaintext}"),)
            try:
                for ack in stub.Stream(batches(), metadata=metadata):
                    acks.append(ack)
                    tenant_services.do_revoke_agent_token(
                        tenant.principal(tenant.operator_admin), token.pk
                    )
                    first_acked.set()
            except grpc.RpcError as exc:
                error = exc
        assert [a.sequence for a in acks] == [1]
        assert error is not None and error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "revoked" in (error.details() or "")
        assert receipts(tenant.operator.pk, "rv") == [1]
        assert stored_samples(tenant.operator.pk) == 40
    finally:
        srv.stop(grace=1)


def test_stream_token_recheck_is_shared_for_half_the_interval(server: IngestServer) -> None:
    tenant = make_tenant("srv-recheck-cache")
    token, plaintext = tenant_services.do_create_agent_token(tenant.operator.pk, name="n")
    cached = IngestServicer(server.writer, Limits(), token_recheck_s=600.0)
    fresh = IngestServicer(server.writer, Limits(), token_recheck_s=0.0)
    assert cached._recheck(plaintext) == fresh._recheck(plaintext) == tenant.operator.pk
    tenant_services.do_revoke_agent_token(tenant.principal(tenant.operator_admin), token.pk)
    assert cached._recheck(plaintext) == tenant.operator.pk  # within half the interval
    assert fresh._recheck(plaintext) is None


def test_refused_records_are_logged_once_per_agent_and_reason_without_tracebacks(
    server: IngestServer, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = make_tenant("srv-reject-log")
    token = token_for(tenant.operator.pk)
    batches = []
    for seq in (1, 2, 3):
        batch = gpu_batch(agent_id="noisy", sequence=seq)
        batch.values[seq] = float("nan")
        batches.append(batch)
    with caplog.at_level("WARNING", logger="ingest.server"):
        acks, error = stream_once(server.port, token, batches)
    assert error is None and sorted(a.rejected_records for a in acks) == [1, 1, 1]
    refused = [r for r in caplog.records if "record(s) refused" in r.getMessage()]
    assert len(refused) == 1 and "non_finite" in refused[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)
    assert stored_samples(tenant.operator.pk) == 3 * 39
