"""What packaging/ ships for operators' own tooling: the Grafana dashboard (valid, every panel
linked to Proof, only metrics Proof exports), and (below) the Helm charts and compose file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proof_web.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packaging"))
import helm_render  # noqa: E402 - packaging/ is scripts, not a package: on the path just above

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


# --- the agent's Helm chart, rendered without helm and checked against the Kubernetes schema --

CHART = ROOT / "packaging" / "helm" / "proof-agent"
# The agent's own command, installed next to this interpreter (pip install -e '.[dev]').
PROOF_AGENT = Path(sys.executable).parent / "proof-agent"
K8S_VERSION = "1.37.0"  # the newest schema kubernetes-validate vendors (the [dev] extra pins it)
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "no eBPF": {"ebpf": {"enabled": False}},
    "no pod list, no metrics": {"kubernetes": {"podList": False}, "metrics": {"enabled": False}},
}


def _render(values: dict[str, Any]) -> list[dict[str, Any]]:
    return helm_render.render_objects(CHART, values)


def _daemonset(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [ds] = [o for o in objects if o["kind"] == "DaemonSet"]
    return ds


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_agent_chart_renders_to_valid_kubernetes_objects(name: str, tmp_path: Path) -> None:
    objects = _render(VALUE_SETS[name])
    kinds = sorted(o["kind"] for o in objects)
    assert {"ConfigMap", "DaemonSet", "ServiceAccount"} <= set(kinds)
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {obj['kind']} {obj['metadata']['name']}: {exc.message}")
    # The agent config and PROOF_AGENT_* environment the chart gives the agent are ones it
    # accepts: `proof-agent doctor` (run as an operator would; the agent is not imported
    # here) exits 2 on an unknown key, value or variable.
    [cm] = [o for o in objects if o["kind"] == "ConfigMap"]
    [container] = _daemonset(objects)["spec"]["template"]["spec"]["containers"]
    config = tmp_path / "proof-agent.toml"
    config.write_text(cm["data"]["proof-agent.toml"])
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for var in container["env"]:
        if var["name"].startswith("PROOF_AGENT_"):
            env[var["name"]] = var["value"].replace("$(NODE_NAME)", "gpu-node-1")
    doctor = subprocess.run(
        [str(PROOF_AGENT), "doctor", "--json", "--config", str(config), "--timeout", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert doctor.returncode == 0, f"{name}: {doctor.stderr}"
    checks = {c["source"]: c["status"] for c in json.loads(doctor.stdout)["checks"]}
    ebpf = VALUE_SETS[name].get("ebpf", {}).get("enabled", True)
    assert (checks["eBPF uprobes"] == "off") is not ebpf, name


def test_privileged_only_with_ebpf_and_host_paths_justified() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    # Each host path in values.yaml has a comment right above it saying why.
    start = lines.index("hostPaths:")
    for i, line in enumerate(lines[start + 1 :], start + 1):
        if not line.startswith("  ") or line.strip().startswith("#"):
            if line and not line.startswith(" "):
                break
            continue
        assert lines[i - 1].strip().startswith("#"), f"host path {line.strip()} has no reason"
    allowed = set(values["hostPaths"].values())
    for name, over in VALUE_SETS.items():
        spec = _daemonset(_render(over))["spec"]["template"]["spec"]
        [container] = spec["containers"]
        sc = container["securityContext"]
        ebpf = over.get("ebpf", {}).get("enabled", True)
        assert sc["privileged"] is ebpf, name
        if not ebpf:
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert "SYS_ADMIN" not in sc["capabilities"]["add"]
        host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        assert set(host.values()) <= allowed, name
        assert ("debugfs" in host) is ebpf, name
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        for vol, path in host.items():
            writable = vol in ("state", "pod-resources", "debugfs")
            assert mounts[vol].get("readOnly", False) is not writable, (name, vol, path)
        assert spec["hostPID"] is True


def test_rbac_reads_pods_only() -> None:
    objects = _render({})
    [role] = [o for o in objects if o["kind"] == "ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    assert not [o for o in _render({"kubernetes": {"podList": False}}) if "Role" in o["kind"]]


def test_renderer_refuses_what_it_does_not_understand(tmp_path: Path) -> None:
    chart = tmp_path / "c"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("name: c\nversion: 0.1.0\nappVersion: '1'\n")
    (chart / "values.yaml").write_text("a: 1\n")
    (chart / "templates" / "x.yaml").write_text("{{ range .Values.a }}x{{ end }}\n")
    with pytest.raises(helm_render.RenderError, match="range"):
        helm_render.render_chart(chart)
    (chart / "templates" / "x.yaml").write_text("v: {{ .Values.b }}\n")
    with pytest.raises(helm_render.RenderError, match=r"\.Values\.b is not set"):
        helm_render.render_chart(chart)
    (chart / "templates" / "x.yaml").write_text("v: {{- if .Values.a }} yes\n")
    with pytest.raises(helm_render.RenderError, match=r"unclosed .if."):
        helm_render.render_chart(chart)


# --- the server processes' compose file ------------------------------------------------------

COMPOSE = ROOT / "packaging" / "compose" / "docker-compose.yml"


def test_compose_runs_every_server_process_with_known_commands_and_settings() -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    assert {"postgres", "redis", "setup", "web", "ingest", "worker", "beat"} <= set(services)
    assert services["beat"]["deploy"]["replicas"] == 1
    commands = {name: svc.get("command") for name, svc in services.items()}
    assert commands["worker"][:4] == ["celery", "-A", "proof_web.celery:app", "worker"]
    assert commands["beat"][:4] == ["celery", "-A", "proof_web.celery:app", "beat"]
    assert commands["web"][-1] == "proof_web.asgi:application"
    assert commands["ingest"][:2] == ["proof", "ingest"]
    assert "ingest" in SUBCOMMANDS and "setup-db" in SUBCOMMANDS and "manage" in SUBCOMMANDS
    for name in ("web", "ingest", "worker", "beat"):
        assert (
            services[name]["depends_on"]["setup"]["condition"] == "service_completed_successfully"
        )
    documented = {
        line.split("=", 1)[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    }
    example = (COMPOSE.parent / "proof.env.example").read_text().splitlines()
    used = {line.split("=", 1)[0] for line in example if "=" in line and not line.startswith("#")}
    assert used and used <= documented, used - documented
