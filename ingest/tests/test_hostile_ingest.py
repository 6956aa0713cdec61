"""Hostile input to the real gRPC server on loopback (issue 16): each is refused by ingest's own
checks, by name, never by the database (UNKNOWN with its error text), and a stream never ends
OK without an ack for every batch it read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from django.db import connection

from contract import limits as L
from contract.wire import ingest_pb2, ingest_pb2_grpc
from ingest import services
from ingest.models import BatchReceipt, Job, Node
from ingest.processing import MAX_CONFIG_JSON_DEPTH, MAX_REGISTER_GPUS
from ingest.server import IngestServer
from ingest.tests.helpers import gpu_batch
from ingest.tests.test_server import receipts, stored_samples, stream_once, token_for
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server() -> Iterator[IngestServer]:
    if connection.vendor == "sqlite":
        pytest.skip("the threaded ingest server needs PostgreSQL (see ingest/tests/conftest.py)")
    services.clear_caches()
    srv = IngestServer("127.0.0.1", 0, writers=2, queue_depth=8)
    srv.start()
    yield srv
    srv.stop(grace=1)


def _register(port: int, token: str, request: Any) -> tuple[Any, grpc.RpcError | None]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = ingest_pb2_grpc.IngestStub(channel)
        try:
            reply = stub.Register(
                request, metadata=(("authorization", f"Bearer {token}"),), timeout=60
            )
        except grpc.RpcError as exc:
            return None, exc
        return reply, None


def test_a_sequence_of_2_63_or_more_is_refused_by_ingest_naming_it(server: IngestServer) -> None:
    op = make_tenant("hseq").operator.pk
    token = token_for(op)
    batches = [gpu_batch("agent-seq", 1), gpu_batch("agent-seq", 2**63), gpu_batch("agent-seq", 3)]
    acks, error = stream_once(server.port, token, batches)
    assert [a.sequence for a in acks] == [1]
    assert error is not None
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"batch {2**63} rejected" in error.details()
    assert "sequence" in error.details() and "database" not in error.details()
    assert receipts(op, "agent-seq") == [1]
    # The largest sequence a receipt holds is accepted.
    acks, error = stream_once(server.port, token, [gpu_batch("agent-seq", 2**63 - 1)])
    assert error is None and [a.sequence for a in acks] == [2**63 - 1]


@pytest.mark.parametrize(
    ("field", "request_fields"),
    [
        ("agent_id", {"agent_id": "a" * (L.MAX_AGENT_ID_CHARS + 1), "hostname": "n"}),
        ("agent_id", {"agent_id": "a\x00b", "hostname": "n"}),
        ("hostname", {"agent_id": "a", "hostname": "n\x00x"}),
        ("agent_version", {"agent_id": "a", "hostname": "n", "agent_version": "1\x00"}),
        ("gpus.0.uuid", {"agent_id": "a", "hostname": "n", "gpus": [{"uuid": "GPU-\x00"}]}),
        (
            "gpus",
            {
                "agent_id": "a",
                "hostname": "n",
                "gpus": [{"uuid": f"GPU-{i}", "index": i} for i in range(10_000)],
            },
        ),
    ],
)
def test_register_refuses_bad_input_naming_the_field(
    server: IngestServer, field: str, request_fields: dict[str, Any]
) -> None:
    op = make_tenant("hreg").operator.pk
    fields = dict(request_fields)
    gpus = fields.pop("gpus", [])
    request = ingest_pb2.RegisterRequest(**fields)
    for gpu in gpus:
        request.gpus.add(**gpu)
    reply, error = _register(server.port, token_for(op), request)
    assert reply is None and error is not None
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert error.details().startswith(f"{field}: "), error.details()
    with tenant_context(op):
        assert not Node.objects.filter(operator_id=op).exists()


def test_register_cleans_over_long_names_as_the_agent_does_and_takes_many_gpus(
    server: IngestServer,
) -> None:
    """An over-long hostname or GPU text is what a real host may have: stored cleaned exactly
    as the agent cleans the same values in its records (contract/limits.py), not refused."""
    op = make_tenant("hreg2").operator.pk
    long_host = "h" * 400
    request = ingest_pb2.RegisterRequest(agent_id="a", hostname=long_host, agent_version="v")
    for i in range(MAX_REGISTER_GPUS):
        request.gpus.add(uuid=f"GPU-{i}", index=i, model="m" * 300)
    reply, error = _register(server.port, token_for(op), request)
    assert error is None, error.details() if error else ""
    assert reply.session_id
    with tenant_context(op):
        node = Node.objects.get(operator_id=op)
        assert node.hostname == L.clean_identifier(long_host, L.MAX_NODE_CHARS)
        assert node.gpus.count() == MAX_REGISTER_GPUS


def test_register_bytes_that_are_not_utf_8_are_invalid_argument(server: IngestServer) -> None:
    """A client other than ours may send a string that is not UTF-8 (a lone surrogate's
    bytes): refused by name, not gRPC's INTERNAL "Exception deserializing request"."""
    op = make_tenant("hreg3").operator.pk
    request = ingest_pb2.RegisterRequest(agent_id="a", hostname="n")
    request.gpus.add(uuid="GPU-1", model="H\x01\x02\x03")
    raw = request.SerializeToString().replace(b"H\x01\x02\x03", b"H\xed\xa0\x80")
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        register = channel.unary_unary(
            "/proof.ingest.v1.Ingest/Register",
            request_serializer=None,
            response_deserializer=ingest_pb2.RegisterResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as refused:
            register(raw, metadata=(("authorization", f"Bearer {token_for(op)}"),), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid RegisterRequest" in refused.value.details()


def _with_config(batch: Any, config_json: str) -> Any:
    """`batch` with a job record (of its first job id) whose config_json is `config_json`
    (set on the wire message: the agent's encoder would refuse to build it)."""
    batch.strings.append("job-deep")
    batch.jobs.add(
        ts_us=int(time.time() * 1e6),
        job=len(batch.strings) - 1,
        state="running",
        config_json=config_json,
    )
    return batch


@pytest.mark.parametrize(
    ("deep", "said"),
    [
        # The issue's: over the size limit before any parse.
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "over the limit"),
        # Within the size limit, past the JSON parser's recursion limit.
        ("[" * 30_000 + "]" * 30_000, "nested"),
        # Parsed, past ingest's own depth limit.
        ('{"a":' * (MAX_CONFIG_JSON_DEPTH + 1) + "1" + "}" * (MAX_CONFIG_JSON_DEPTH + 1), "nested"),
    ],
    ids=["100000-deep", "30000-deep", "limit+1-deep"],
)
def test_deep_config_json_is_refused_alone_with_an_ack_saying_so(
    server: IngestServer, deep: str, said: str
) -> None:
    op = make_tenant("hdeep").operator.pk
    batch = _with_config(gpu_batch("agent-deep", 1, job="job-deep"), deep)
    acks, error = stream_once(server.port, token_for(op), [batch, gpu_batch("agent-deep", 2)])
    assert error is None
    acks.sort(key=lambda ack: ack.sequence)
    assert [a.sequence for a in acks] == [1, 2]
    assert acks[0].status == ingest_pb2.Ack.STORED
    assert acks[0].rejected_records == 1
    assert said in acks[0].rejections[0].message
    assert acks[0].rejections[0].kind == "job"
    assert stored_samples(op) == 2 * 2 * 2 * 10  # both batches' samples, the record refused
    with tenant_context(op):
        job = Job.objects.get(operator_id=op, job_id="job-deep")
        assert job.config is None


def test_a_batch_of_only_a_deep_config_is_refused_whole_and_never_ends_ok(
    server: IngestServer,
) -> None:
    op = make_tenant("hdeep2").operator.pk
    deep = "[" * 30_000 + "]" * 30_000
    only = _with_config(gpu_batch("agent-d2", 1, job=None, gpus=0), deep)
    acks, error = stream_once(server.port, token_for(op), [only, gpu_batch("agent-d2", 2)])
    assert acks == []
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "batch 1 rejected" in error.details() and "nested" in error.details()
    with tenant_context(op):
        assert not BatchReceipt.objects.filter(operator_id=op).exists()


def test_a_stream_never_ends_ok_without_the_ack_of_a_batch_it_read(
    server: IngestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure while a read batch is in hand (here its hand-over to the writers raises, as a
    database outage in the token re-check would) ends the stream UNAVAILABLE naming it; the
    agent's resend on a new stream stores it."""
    op = make_tenant("hlost").operator.pk
    token = token_for(op)
    submit = server.writer.submit
    calls: list[int] = []

    def failing_once(item: Any) -> None:
        calls.append(item.batch.sequence)
        if len(calls) == 2:
            raise RuntimeError("the queue is gone")
        submit(item)

    monkeypatch.setattr(server.writer, "submit", failing_once)
    batches = [gpu_batch("agent-lost", 1), gpu_batch("agent-lost", 2)]
    acks, error = stream_once(server.port, token, batches)
    assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE
    assert "batch 2 could not be stored" in error.details()
    assert 2 not in [a.sequence for a in acks]
    acks, error = stream_once(server.port, token, [gpu_batch("agent-lost", 2)])
    assert error is None and [a.sequence for a in acks] == [2]
    assert receipts(op, "agent-lost") == [1, 2]
