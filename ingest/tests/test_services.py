"""Storing batches and reading them back, on the real database (PostgreSQL with row-level
security in CI)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.db import connection

from contract import signals
from ingest import blocks, selectors, services
from ingest.models import BatchReceipt, Gpu, Job, JobRank, LogLine, Node, Process, Series
from ingest.processing import Limits, decode_batch
from ingest.storage import BLOCK_TABLE
from ingest.tests.helpers import gpu_batch
from tenants import services as tenant_services
from tenants.context import system_context, tenant_context
from tenants.models import MatchField
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db

LIMITS = Limits()


def store(operator_id: int, batch: object) -> services.StoreOutcome:
    return services.store_batch(operator_id, decode_batch(batch, LIMITS))


def block_rows(operator_id: int) -> int:
    """Block rows visible to the operator: on PostgreSQL through row-level security alone (no
    WHERE clause); on SQLite, which has none, by the explicit filter every read uses."""
    where = "" if connection.vendor == "postgresql" else f" WHERE operator_id = {operator_id:d}"
    with tenant_context(operator_id), connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {BLOCK_TABLE}{where}")
        return int(cursor.fetchone()[0])


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    services.clear_caches()


def test_batch_is_stored_and_read_back_exactly() -> None:
    tenant = make_tenant("ing-a")
    start = float(int(time.time()) - 100)
    outcome = store(tenant.operator.pk, gpu_batch(gpus=2, seconds=10, start=start))
    assert outcome == services.StoreOutcome(services.StoreStatus.STORED, 40)
    data = selectors.job_series(tenant.operator.pk, "job-1", start, start + 60)
    assert len(data) == 4
    by_key = {(d.info.gpu_index, d.info.name): d for d in data}
    util1 = by_key[(1, signals.DCGM_FI_DEV_GPU_UTIL)]
    np.testing.assert_allclose(util1.ts, start + np.arange(10))
    np.testing.assert_array_equal(util1.values, 1000 + np.arange(10))
    assert util1.info.node == "node-a" and util1.info.rank == 1
    # a window inside the batch returns only the samples inside it
    part = selectors.job_series(tenant.operator.pk, "job-1", start + 2, start + 4)
    assert all(len(d.values) == 3 for d in part)


def test_duplicate_batch_is_stored_once() -> None:
    tenant = make_tenant("ing-dup")
    batch = gpu_batch(sequence=5)
    assert store(tenant.operator.pk, batch).status is services.StoreStatus.STORED
    assert store(tenant.operator.pk, batch).status is services.StoreStatus.DUPLICATE
    assert block_rows(tenant.operator.pk) == 1
    with tenant_context(tenant.operator.pk):
        assert BatchReceipt.objects.for_tenant(tenant.operator.pk).count() == 1
    data = selectors.job_series(tenant.operator.pk, "job-1", time.time() - 60, time.time())
    assert sum(len(d.values) for d in data) == 40


def test_same_agent_id_and_sequence_of_another_operator_is_not_a_duplicate() -> None:
    a, b = make_tenant("ing-x1"), make_tenant("ing-x2")
    batch = gpu_batch(agent_id="same", sequence=1)
    assert store(a.operator.pk, batch).status is services.StoreStatus.STORED
    assert store(b.operator.pk, batch).status is services.StoreStatus.STORED


def test_operator_a_data_is_invisible_to_operator_b() -> None:
    a, b = make_tenant("ing-iso-a"), make_tenant("ing-iso-b")
    store(a.operator.pk, gpu_batch(node="shared-name", job="job-shared"))
    assert selectors.job_series(b.operator.pk, "job-shared", 0, time.time() + 10) == []
    assert selectors.node_series(b.operator.pk, "shared-name", 0, time.time() + 10) == []
    assert block_rows(b.operator.pk) == 0
    assert block_rows(a.operator.pk) == 1
    if connection.vendor == "postgresql":  # the second wall: even an unscoped query sees nothing
        with tenant_context(b.operator.pk):
            assert not Series.objects.filter(operator_id=a.operator.pk).exists()


def test_job_is_attributed_to_customer_by_mapping_rule_and_inventory_updated() -> None:
    tenant = make_tenant("ing-map")
    tenant_services.do_create_mapping_rule(
        tenant.principal(tenant.operator_admin),
        match_field=MatchField.SLURM_ACCOUNT,
        value="team-llm",
        customer_id=tenant.customer.pk,
    )
    now = time.time()
    records = [
        {
            "type": "job",
            "ts": now - 5,
            "job": "4242",
            "kind": "training",
            "state": "running",
            "world_size": 2,
            "slurm_account": "team-llm",
            "config": {"lr": 0.001},
        },
        {
            "type": "process",
            "ts": now - 5,
            "node": "node-a",
            "pid": 100,
            "job": "4242",
            "rank": 1,
            "local_rank": 1,
            "gpu": "GPU-node-a-1",
            "cmd": ["python", "train.py"],
        },
        # its DataLoader worker: the rank's RANK, no GPU (it must not take the rank's place)
        {
            "type": "process",
            "ts": now - 4,
            "node": "node-a",
            "pid": 101,
            "job": "4242",
            "rank": 1,
            "local_rank": 1,
            "cmd": ["python", "train.py"],
        },
        {"type": "exit", "ts": now - 1, "node": "node-a", "pid": 100, "exit_code": 0},
        {
            "type": "log",
            "ts": now - 3,
            "node": "node-a",
            "job": "4242",
            "line": "step 1 loss 2.0",
            "step": 1,
            "stream": "stdout",
        },
    ]
    store(tenant.operator.pk, gpu_batch(job="4242", extra_records=records))
    with tenant_context(tenant.operator.pk):
        job = Job.objects.for_tenant(tenant.operator.pk).get(job_id="4242")
        assert job.customer_id == tenant.customer.pk
        assert job.kind == "training" and job.world_size == 2 and job.config == {"lr": 0.001}
        rank = JobRank.objects.for_tenant(tenant.operator.pk).get(job=job, rank=1)
        assert rank.gpu == "GPU-node-a-1" and rank.pid == 100
        process = Process.objects.for_tenant(tenant.operator.pk).get(pid=100)
        assert process.exit_code == 0 and process.cmd == "python train.py"
        assert Node.objects.for_tenant(tenant.operator.pk).filter(hostname="node-a").exists()
        assert LogLine.objects.for_tenant(tenant.operator.pk).count() == 1
    finished = [{"type": "job", "ts": now, "job": "4242", "state": "completed", "exit_code": 0}]
    store(tenant.operator.pk, gpu_batch(sequence=2, job="4242", extra_records=finished))
    with tenant_context(tenant.operator.pk):
        job = Job.objects.for_tenant(tenant.operator.pk).get(job_id="4242")
        assert job.state == "completed" and job.ended_at is not None
    # the customer principal sees the job through for_tenant
    with tenant_context(tenant.operator.pk):
        viewer = tenant.principal(tenant.customer_viewer)
        assert list(Job.objects.for_tenant(viewer).values_list("job_id", flat=True)) == ["4242"]


def test_node_series_over_a_window() -> None:
    tenant = make_tenant("ing-node")
    start = float(int(time.time()) - 300)
    store(tenant.operator.pk, gpu_batch(sequence=1, start=start, seconds=30, job=None))
    store(tenant.operator.pk, gpu_batch(sequence=2, start=start + 30, seconds=30, job=None))
    data = selectors.node_series(
        tenant.operator.pk, "node-a", start + 20, start + 39, names=[signals.DCGM_FI_DEV_GPU_UTIL]
    )
    assert len(data) == 2
    for series in data:
        np.testing.assert_allclose(series.ts, start + np.arange(20, 40))
        np.testing.assert_array_equal(
            series.values,
            (series.info.gpu_index or 0) * 1000 + np.r_[np.arange(20, 30), np.arange(10)],
        )


def test_job_logs_around_a_time_and_events_of_gpu_and_node() -> None:
    tenant = make_tenant("ing-logs")
    now = float(int(time.time()))
    records = [
        {"type": "log", "ts": now - 50 + i, "node": "node-a", "job": "job-1", "line": f"l{i}"}
        for i in range(40)
    ] + [
        {
            "type": "event",
            "ts": now - 30,
            "name": "xid",
            "node": "node-a",
            "gpu": "GPU-node-a-1",
            "gpu_index": 1,
            "value": 79,
            "text": "NVRM: Xid 79",
        },
        {
            "type": "event",
            "ts": now - 20,
            "name": "link_down",
            "node": "node-a",
            "labels": {"device": "mlx5_0"},
        },
    ]
    store(tenant.operator.pk, gpu_batch(extra_records=records))
    lines = selectors.job_logs(tenant.operator.pk, "job-1", around=now - 30, before_s=5, after_s=5)
    assert [row.line for row in lines] == [f"l{i}" for i in range(15, 26)]
    gpu_events = selectors.events(tenant.operator.pk, gpu="GPU-node-a-1")
    assert [(e.name, e.value, e.text) for e in gpu_events] == [("xid", 79.0, "NVRM: Xid 79")]
    node_events = selectors.events(tenant.operator.pk, node="node-a")
    assert [e.name for e in node_events] == ["xid", "link_down"]
    assert node_events[1].labels == {"device": "mlx5_0"}
    other = make_tenant("ing-logs-b")
    assert selectors.events(other.operator.pk, node="node-a") == []
    assert selectors.job_logs(other.operator.pk, "job-1", around=now - 30) == []


def test_gpu_counters_over_30_days_come_from_rollups() -> None:
    tenant = make_tenant("ing-roll")
    hour = 3600.0
    now = float(int(time.time()))
    counters = (signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER)
    # three hours, 3 h / 2 h / 1 h ago, of one-minute readings (inside the 7-day window)
    for seq, back in enumerate((3, 2, 1), start=1):
        start = (now // hour - back) * hour
        store(
            tenant.operator.pk,
            gpu_batch(sequence=seq, start=start, seconds=3600, gpus=1, job=None, names=counters),
        )
        services.build_rollups(tenant.operator.pk, int(start * 1000))
    data = selectors.gpu_counters(tenant.operator.pk, "GPU-node-a-0", now - 30 * 86400, now)
    assert {d.info.name for d in data} == set(counters)
    sbe = next(d for d in data if d.info.name == signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL)
    assert len(sbe.bucket_start) == 3
    assert list(sbe.count) == [3600, 3600, 3600]
    assert list(sbe.min) == [0, 0, 0] and list(sbe.last) == [3599, 3599, 3599]
    # rebuilding is idempotent
    services.build_rollups(tenant.operator.pk, int(((now // hour) - 1) * hour * 1000))
    assert len(selectors.gpu_counters(tenant.operator.pk, "GPU-node-a-0", 0, now)[0].count) == 3


def test_blocks_table_has_row_level_security_on_parent_and_partitions() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row-level security exists on PostgreSQL only")
    with system_context(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity FROM pg_class c "
            "WHERE c.relkind IN ('r', 'p') AND c.relname LIKE %s",
            [BLOCK_TABLE + "%"],
        )
        rows = cursor.fetchall()
    assert len(rows) >= 10  # parent, default and the daily partitions around today
    assert all(enabled and forced for _name, enabled, forced in rows), rows


def test_batches_move_node_last_seen_at_forward_at_most_once_per_interval() -> None:
    tenant = make_tenant("ing-seen")
    op = tenant.operator.pk
    t0 = datetime.now(UTC) - timedelta(minutes=5)
    with tenant_context(op):
        Node.objects.create(operator_id=op, hostname="node-a", last_seen_at=None)

    def seen() -> datetime | None:
        with tenant_context(op):
            return Node.objects.for_tenant(op).get(hostname="node-a").last_seen_at

    services.store_batch(op, decode_batch(gpu_batch(sequence=1), LIMITS), now=t0)
    assert seen() == t0
    # Within the interval: no further write for this node.
    services.store_batch(op, decode_batch(gpu_batch(sequence=2), LIMITS), now=t0 + timedelta(1))
    assert seen() == t0
    # Once the interval has passed (as far as this process knows), the next batch moves it.
    services._node_seen.clear()
    later = t0 + timedelta(seconds=90)
    services.store_batch(op, decode_batch(gpu_batch(sequence=3), LIMITS), now=later)
    assert seen() == later


def test_gpus_a_batch_carries_are_in_the_inventory_and_seen_at_the_nodes_cadence() -> None:
    """A GPU streaming samples is in the inventory and "seen" whether or not its agent's
    Register listed it, and stays seen while it streams: the fleet-health pass and the heat map
    take the GPUs seen in the last day, and one registered 25 h ago was no longer among them."""
    tenant = make_tenant("ing-gpu-seen")
    op = tenant.operator.pk
    t0 = datetime.now(UTC) - timedelta(hours=25)
    # GPU 0 registered a day ago with its model; GPU 1 never registered.
    services.register_agent(
        op,
        agent_id="agent-1",
        hostname="node-a",
        agent_version="test",
        gpus=[{"uuid": "GPU-node-a-0", "index": 0, "model": "H100"}],
        now=t0,
    )

    def inventory() -> dict[str, tuple[int | None, str, datetime | None]]:
        with tenant_context(op):
            return {
                uuid: (index, model, seen)
                for uuid, index, model, seen in Gpu.objects.for_tenant(op).values_list(
                    "uuid", "index", "model", "last_seen_at"
                )
            }

    services._node_seen.clear()
    now = datetime.now(UTC)
    services.store_batch(op, decode_batch(gpu_batch(sequence=1), LIMITS), now=now)
    assert inventory() == {"GPU-node-a-0": (0, "H100", now), "GPU-node-a-1": (1, "", now)}
    assert "GPU-node-a-1" in {g for o, g in selectors.gpus_seen_since(now - timedelta(days=1))}
    # Within the node's interval nothing is written again; after it, last_seen_at moves.
    services.store_batch(op, decode_batch(gpu_batch(sequence=2), LIMITS), now=now + timedelta(1))
    assert inventory()["GPU-node-a-1"][2] == now
    services._node_seen.clear()
    later = now + timedelta(seconds=90)
    services.store_batch(op, decode_batch(gpu_batch(sequence=3), LIMITS), now=later)
    assert {seen for _i, _m, seen in inventory().values()} == {later}
    # Another operator's batch with the same GPU ids makes rows of its own only.
    other = make_tenant("ing-gpu-seen-b").operator.pk
    services.store_batch(other, decode_batch(gpu_batch(sequence=1), LIMITS), now=later)
    assert inventory()["GPU-node-a-0"] == (0, "H100", later)
    with tenant_context(other):
        assert Gpu.objects.for_tenant(other).count() == 2


def test_blocks_of_formats_1_2_and_3_read_back_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tenant = make_tenant("ing-formats")
    op = tenant.operator.pk
    start = float(int(time.time()) - 100)
    # The first batches as servers from before formats 2 and 3 wrote them, the third as now.
    for sequence, old_encode in ((1, blocks.encode_v1), (2, blocks.encode_v2)):
        with monkeypatch.context() as patch:
            patch.setattr(blocks, "encode", old_encode)
            store(op, gpu_batch(sequence=sequence, seconds=10, start=start + 10 * (sequence - 1)))
    store(op, gpu_batch(sequence=3, seconds=10, start=start + 20))
    with tenant_context(op), connection.cursor() as cursor:
        where = "" if connection.vendor == "postgresql" else f" WHERE operator_id = {op:d}"
        cursor.execute(f"SELECT payload FROM {BLOCK_TABLE}{where} ORDER BY start_ms")
        magics = [bytes(row[0])[:3] for row in cursor.fetchall()]
    assert magics == [b"PB1", b"PB2", b"PB3"]
    data = selectors.job_series(op, "job-1", start, start + 30)
    util1 = {(d.info.gpu_index, d.info.name): d for d in data}[(1, signals.DCGM_FI_DEV_GPU_UTIL)]
    np.testing.assert_allclose(util1.ts, start + np.arange(30))
    np.testing.assert_array_equal(util1.values, 1000 + np.concatenate([np.arange(10)] * 3))
    part = selectors.job_series(op, "job-1", start + 8, start + 21)
    assert all(len(d.values) == 14 for d in part)


def test_every_job_record_of_a_batch_applies_not_only_the_last() -> None:
    # proof-agent exec writes a job record at start (scheduler, world size) and another at
    # the end (state, exit code); when both land in one batch the first must not be dropped.
    tenant = make_tenant("ing-jobrecs")
    now = time.time()
    records = [
        {
            "type": "job",
            "ts": now - 9,
            "job": "exec-n-1-2-3",
            "kind": "training",
            "scheduler": "proof-exec",
            "world_size": 2,
            "state": "running",
            "slurm_account": "team-a",
        },
        {"type": "job", "ts": now - 2, "job": "exec-n-1-2-3", "state": "completed", "exit_code": 0},
    ]
    store(tenant.operator.pk, gpu_batch(job="exec-n-1-2-3", extra_records=records))
    with tenant_context(tenant.operator.pk):
        job = Job.objects.for_tenant(tenant.operator.pk).get(job_id="exec-n-1-2-3")
    assert job.scheduler == "proof-exec" and job.world_size == 2 and job.kind == "training"
    assert job.state == "completed" and job.exit_code == 0 and job.ended_at is not None
    assert job.attributes.get("slurm_account") == "team-a"


def _rank_records(job: str, now: float, *, world: int = 2) -> list[dict[str, object]]:
    return [
        {
            "type": "process",
            "ts": now - 9,
            "node": "node-a",
            "pid": 500 + rank,
            "job": job,
            "rank": rank,
            "local_rank": rank,
            "world_size": world,
            "cmd": ["python", "-m", "train"],
        }
        for rank in range(world)
    ]


def _exit(pid: int, code: int, ts: float) -> dict[str, object]:
    return {"type": "exit", "ts": ts, "node": "node-a", "pid": pid, "exit_code": code}


def _stored_job(operator_id: int, job_id: str) -> Job:
    with tenant_context(operator_id):
        return Job.objects.for_tenant(operator_id).get(job_id=job_id)


@pytest.mark.parametrize(
    ("codes", "state", "exit_code"), [((0, 0), "completed", 0), ((0, 3), "failed", 3)]
)
def test_a_job_without_a_scheduler_ends_when_every_rank_exited(
    codes: tuple[int, int], state: str, exit_code: int
) -> None:
    # torchrun workers under one `proof-agent exec` each: no job record says the world size
    # or the end; the ranks' process and exit records do.
    tenant = make_tenant(f"ing-ranks-end-{state}")
    op, job_id, now = tenant.operator.pk, "torchelastic-3f2a", time.time()
    store(op, gpu_batch(job=job_id, sequence=1, extra_records=_rank_records(job_id, now)))
    store(op, gpu_batch(job=job_id, sequence=2, extra_records=[_exit(500, codes[0], now - 4)]))
    half = _stored_job(op, job_id)
    assert half.state == "running" and half.ended_at is None  # rank 1 still runs
    store(op, gpu_batch(job=job_id, sequence=3, extra_records=[_exit(501, codes[1], now - 2)]))
    job = _stored_job(op, job_id)
    assert (job.state, job.exit_code, job.world_size) == (state, exit_code, 2)
    assert job.ended_at is not None and abs(job.ended_at.timestamp() - (now - 2)) < 0.01


def test_a_slurm_job_is_not_ended_by_its_ranks_exiting() -> None:
    tenant = make_tenant("ing-ranks-slurm")
    op, now = tenant.operator.pk, time.time()
    records: list[dict[str, object]] = [
        {"type": "job", "ts": now - 9, "job": "777", "scheduler": "slurm", "state": "running"},
        *_rank_records("777", now),
        _exit(500, 0, now - 3),
        _exit(501, 0, now - 2),
    ]
    store(op, gpu_batch(job="777", extra_records=records))
    assert _stored_job(op, "777").state == "running"  # sacct's record says when it ends


def test_a_catalog_read_of_series_absent_from_the_window_is_empty() -> None:
    """Reading some series over a range whose blocks hold only others (blocks of different
    shapes, so the general path): empty series, not an error. The live window cache reads a
    series new to a job's catalog over what it already holds, where it may have no samples."""
    op = make_tenant("catalog-absent").operator.pk
    start = time.time() - 300
    store(op, gpu_batch("agent-c", 1, start=start, seconds=10))
    store(op, gpu_batch("agent-c", 2, start=start + 10, names=(signals.DCGM_FI_DEV_SM_CLOCK,)))
    late = (signals.DCGM_FI_DEV_FB_USED,)
    store(op, gpu_batch("agent-c", 3, start=start + 100, seconds=10, names=late))
    catalog = selectors.job_series_catalog(op, "job-1")
    assert {i.name for i in catalog.infos.values()} >= {signals.DCGM_FI_DEV_FB_USED}
    absent = selectors.SeriesCatalog(
        {sid: i for sid, i in catalog.infos.items() if i.name == signals.DCGM_FI_DEV_FB_USED},
        catalog.node_ids,
    )
    got = selectors.catalog_samples(op, absent, start, start + 20)
    assert len(got) == 2 and all(len(s.ts) == 0 for s in got)
    # The same catalog over the range that holds them reads them all.
    got = selectors.catalog_samples(op, absent, start + 100, start + 110)
    assert sorted(len(s.ts) for s in got) == [10, 10]
