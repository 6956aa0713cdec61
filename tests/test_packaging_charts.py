"""What packaging/ ships for operators' own tooling: the Grafana dashboard (valid, every panel
linked to Proof, only metrics Proof exports), and (below) the Helm charts and compose file."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "packaging" / "grafana" / "proof-dashboard.json"
# Where each exported metric name is defined (a test against the source, so a rename breaks it).
METRIC_SOURCES = (
    ROOT / "agent" / "runtime" / "metrics.py",
    ROOT / "ingest" / "metrics.py",
    ROOT / "investigations" / "api" / "metrics.py",
)


def exported_metric_names() -> set[str]:
    names: set[str] = set()
    for path in METRIC_SOURCES:
        for name in re.findall(r'"(proof_[a-z_]+)"', path.read_text()):
            names.add(name)
    # prometheus_client's suffixes: counters expose _total, histograms _bucket/_sum/_count.
    return names | {n + s for n in names for s in ("_total", "_bucket", "_sum", "_count")}


def test_dashboard_panels_link_to_proof_and_query_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exported = exported_metric_names()
    assert "proof_open_incidents" in exported and "proof_agent_spool_batches" in exported
    assert dash["uid"] and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"prometheus", "proof_url"} <= variables
    for panel in dash["panels"]:
        assert panel["links"], f"panel {panel['title']!r} has no link to Proof"
        assert all(link["url"].startswith("${proof_url}/") for link in panel["links"])
        for target in panel["targets"]:
            used = set(re.findall(r"\b(proof_[a-z_]+)\b", target["expr"]))
            assert used, target["expr"]
            unknown = used - exported
            assert not unknown, (
                f"panel {panel['title']!r} queries {unknown}, which Proof does not export"
            )
    table = next(p for p in dash["panels"] if p["type"] == "table")
    assert table["fieldConfig"]["defaults"]["links"][0]["url"] == "${__data.fields.url}"
    [annotation] = dash["annotations"]["list"]
    assert annotation["target"]["url"] == "${proof_url}/api/v1/grafana-annotations/"
    params = {p["key"]: p["value"] for p in annotation["target"]["url_options"]["params"]}
    assert params == {"from": "${__from}", "to": "${__to}"}
