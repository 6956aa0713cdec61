"""Operations: the `proof ingest` process (health, metrics, clean stop) and partition upkeep."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from django.db import connections
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ingest import storage
from ingest.bench import proof_ingest_command
from ingest.processing import Limits
from ingest.server import IngestServer, InsecureBindRefused

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_proof_ingest_serves_health_and_metrics_and_stops_on_sigterm() -> None:
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "PROOF_ENV": "test"}
    proc = subprocess.Popen(
        proof_ingest_command(port, "--metrics-port", str(metrics_port)),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and status is None:
            try:
                with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                    reply = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service="proof.ingest.v1.Ingest"), timeout=2
                    )
                    status = reply.status
            except grpc.RpcError:
                time.sleep(0.3)
        assert status == health_pb2.HealthCheckResponse.SERVING
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
        text = body.decode()
        for name in (
            "proof_ingest_queue_depth",
            "proof_ingest_ack_latency_seconds",
            "proof_ingest_streams",
        ):
            assert name in text
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert "listening on 127.0.0.1" in output


def test_plaintext_on_a_public_address_is_refused() -> None:
    with pytest.raises(InsecureBindRefused, match="refusing plaintext"):
        IngestServer("0.0.0.0", 0, limits=Limits())  # noqa: S104 - the test checks that this bind is refused


@pytest.mark.django_db(
    databases=["default", "owner"] if "owner" in connections.settings else ["default"]
)
def test_partitions_are_created_ahead_and_dropped_after_retention() -> None:
    if "owner" not in connections.settings or connections["owner"].vendor != "postgresql":
        pytest.skip("partitions exist on PostgreSQL only")
    owner = connections["owner"]
    future = datetime.now(UTC) + timedelta(days=30)
    created = storage.ensure_partitions(owner, days_back=0, days_ahead=0, now=future)
    name = f"{storage.BLOCK_TABLE}_p{future:%Y%m%d}"
    assert created == [name]
    assert name in storage.partition_names(owner)
    with owner.cursor() as cursor:
        cursor.execute(
            "SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE relname = %s", [name]
        )
        assert cursor.fetchone() == (True, True)
    # seen from 40 days later with 5 days' retention, that day's partition is dropped
    dropped = storage.drop_expired_partitions(5, owner, now=future + timedelta(days=10))
    assert name in dropped
    assert name not in storage.partition_names(owner)
