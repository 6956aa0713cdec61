"""Several nodes' series catalogs in one read are each node's own catalog."""

from __future__ import annotations

import time

import pytest

from contract import signals
from ingest import selectors
from ingest import services as ingest_services
from ingest.processing import Limits, decode_batch
from ingest.tests.helpers import gpu_batch
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db


def _node_level(node: str, port: str) -> dict[str, object]:
    return {
        "type": "sample",
        "name": "ib.port_xmit_data",
        "node": node,
        "labels": {"port": port},
        "ts": time.time() - 1,
        "value": 1.0,
    }


def test_nodes_series_catalogs_match_the_per_node_catalogs() -> None:
    op = make_tenant("catalogs").operator.pk
    other = make_tenant("catalogs-other").operator.pk
    for k, node in enumerate(("node-a", "node-b")):
        extra = [_node_level(node, "mlx5_0"), _node_level(node, "mlx5_1")]
        batch = gpu_batch(f"agent-{node}", 1, node=node, extra_records=extra)
        ingest_services.store_batch(op, decode_batch(batch, Limits()))
        ingest_services.store_batch(
            other, decode_batch(gpu_batch(f"agent-{node}", 1 + k, node=node), Limits())
        )
    for node_level in (True, False):
        together = selectors.nodes_series_catalogs(
            op, ["node-a", "node-b", "node-missing"], node_level=node_level
        )
        assert set(together) == {"node-a", "node-b", "node-missing"}
        for node in ("node-a", "node-b"):
            alone = selectors.node_series_catalog(op, node, node_level=node_level)
            assert (together[node].infos, together[node].node_ids) == (
                alone.infos,
                alone.node_ids,
            )
            assert alone.infos
        assert together["node-missing"].infos == {}
    own = selectors.nodes_series_catalogs(op, ["node-a"], node_level=True)["node-a"]
    assert {i.label("port") for i in own.infos.values()} == {"mlx5_0", "mlx5_1"}
    assert all(not i.gpu and not i.job for i in own.infos.values())


def test_a_read_from_known_catalogs_adds_only_the_newer_series_and_matches_a_whole_read() -> None:
    op = make_tenant("catalogs-delta").operator.pk
    for node in ("node-a", "node-b"):
        batch = gpu_batch(f"agent-{node}", 1, node=node, extra_records=[_node_level(node, "p0")])
        ingest_services.store_batch(op, decode_batch(batch, Limits()))
    known = selectors.nodes_series_catalogs(op, ["node-a", "node-b"], node_level=True)
    job_known = selectors.job_series_catalog(op, "job-1")
    # New series on one node (a port appears) and for the job (a signal it had not sent).
    batch = gpu_batch(
        "agent-node-a",
        2,
        node="node-a",
        names=(signals.DCGM_FI_DEV_SM_CLOCK,),
        extra_records=[_node_level("node-a", "p1")],
    )
    ingest_services.store_batch(op, decode_batch(batch, Limits()))
    delta = selectors.nodes_series_catalogs(op, ["node-a", "node-b"], node_level=True, known=known)
    whole = selectors.nodes_series_catalogs(op, ["node-a", "node-b"], node_level=True)
    for node in ("node-a", "node-b"):
        assert (delta[node].infos, delta[node].node_ids) == (
            whole[node].infos,
            whole[node].node_ids,
        )
    assert {i.label("port") for i in delta["node-a"].infos.values()} == {"p0", "p1"}
    assert len(delta["node-a"].infos) == len(known["node-a"].infos) + 1
    job_delta = selectors.job_series_catalog(op, "job-1", known=job_known)
    job_whole = selectors.job_series_catalog(op, "job-1")
    assert job_delta.infos == job_whole.infos and job_delta.max_id == job_whole.max_id
    assert len(job_delta.infos) > len(job_known.infos)
