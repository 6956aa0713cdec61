"""Several nodes' series catalogs in one read are each node's own catalog."""

from __future__ import annotations

import time

import pytest

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
            assert together[node] == alone and alone.infos
        assert together["node-missing"].infos == {}
    own = selectors.nodes_series_catalogs(op, ["node-a"], node_level=True)["node-a"]
    assert {i.label("port") for i in own.infos.values()} == {"mlx5_0", "mlx5_1"}
    assert all(not i.gpu and not i.job for i in own.infos.values())
