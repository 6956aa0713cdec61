"""`proof replay` of a simulated trace stores exactly the trace's samples (real server, real
client, real database)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract.trace.reader import TraceReader
from contract.wire.client import BatchSender, open_channel
from contract.wire.replay import ReplayReport, replay
from ingest import selectors, services
from ingest.models import LogLine
from ingest.server import IngestServer
from simulator import simulate
from simulator.scenarios import list_scenarios
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.testing import Tenant, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
_SERIES_KEYS = ("node", "gpu", "gpu_index", "pid", "job", "rank", "local_rank")


def _key(name: str, rec: Any, labels: Any) -> tuple[Any, ...]:
    get = rec.get if isinstance(rec, dict) else lambda k: getattr(rec, k)
    values = [get(k) for k in _SERIES_KEYS]
    return (name, *(None if v == "" else v for v in values), tuple(sorted((labels or {}).items())))


def _replay_to_server(path: Path, slug: str, **options: Any) -> tuple[Tenant, ReplayReport]:
    """`path` replayed into a real ingest server on loopback as the agent of a new tenant."""
    services.clear_caches()
    tenant = make_tenant(slug)
    _, token = tenant_services.do_create_agent_token(tenant.operator.pk, name="replay")
    server = IngestServer("127.0.0.1", 0, writers=2)
    port = server.start()
    try:
        sender = BatchSender(open_channel(f"127.0.0.1:{port}"), token)
        report = replay(str(path), sender, **options)
        sender.close()
    finally:
        server.stop(grace=1)
    return tenant, report


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    scenario = list_scenarios()[0].name
    path = tmp_path / "sim.jsonl.gz"
    simulate(scenario, seed=3, duration_s=90, nodes=1, gpus_per_node=2).write(path)
    return path


def test_replay_stores_exactly_the_trace_samples(trace: Path) -> None:
    tenant, report = _replay_to_server(trace, "replay", agent_id="replay-test", batch_seconds=15)
    assert report.rejected == [] and report.batches >= 6

    expected: dict[tuple[Any, ...], list[tuple[int, float]]] = defaultdict(list)
    nodes = set()
    for rec in TraceReader(trace):
        if rec.get("type") == "sample" and math.isfinite(rec["value"]):
            ts_ms = round((rec["ts"] + report.offset_s) * 1000)
            expected[_key(rec["name"], rec, rec.get("labels"))].append((ts_ms, float(rec["value"])))
            nodes.add(rec.get("node") or "")
    assert report.samples == sum(len(v) for v in expected.values()) > 1000

    stored: dict[tuple[Any, ...], list[tuple[int, float]]] = {}
    lo = min(t for v in expected.values() for t, _ in v) / 1000 - 1
    hi = max(t for v in expected.values() for t, _ in v) / 1000 + 1
    for node in nodes:
        for series in selectors.node_series(tenant.operator.pk, node, lo, hi):
            info = series.info
            key = (
                info.name,
                info.node or None,
                info.gpu or None,
                info.gpu_index,
                info.pid,
                info.job or None,
                info.rank,
                info.local_rank,
                info.labels,  # already sorted (key, value) pairs
            )
            ts_ms = np.rint(series.ts * 1000).astype(np.int64)
            stored[key] = list(zip(ts_ms.tolist(), series.values.tolist(), strict=True))
    assert set(stored) == set(expected)
    for key, samples in expected.items():
        assert sorted(stored[key]) == sorted(samples), key


def test_proof_replay_command_reports_refused_token(trace: Path) -> None:
    server = IngestServer("127.0.0.1", 0, writers=1)
    port = server.start()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "proof_web.cli",
                "replay",
                str(trace),
                "--server",
                f"127.0.0.1:{port}",
                "--token",
                "prfa_not-a-token",
                "--as-fast-as-possible",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.stop(grace=1)
    assert proc.returncode == 1
    assert "refused the agent token" in proc.stderr


def test_replay_of_a_dirty_trace_sends_it_cleaned(tmp_path: Path) -> None:

    now = time.time()
    records = [
        {"type": "meta", "format": "proof-trace", "version": 1},
        {"type": "log", "ts": now, "line": "x" * 26_498, "node": "n1"},
        {"type": "log", "ts": now, "line": "\x00\x00 corrupted", "node": "n1"},
        {"type": "sample", "ts": now, "name": "x", "value": 1.0, "gpu": "GPU-" + "d" * 196},
    ]
    path = tmp_path / "dirty.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    tenant, report = _replay_to_server(
        path, "replay-dirty", agent_id="replay-dirty", keep_time=True
    )
    assert report.rejected == [] and report.records_refused == 0
    assert report.cleaned == 3 and report.problems == 3 and report.samples == 1
    with tenant_context(tenant.operator.pk):
        lines = sorted(
            LogLine.objects.for_tenant(tenant.operator.pk).values_list("line", flat=True)
        )
    assert len(lines) == 2 and "\ufffd\ufffd corrupted" in lines
    assert any(len(line) == 16384 and "…[truncated " in line for line in lines)
