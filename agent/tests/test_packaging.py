"""The single-file agent: build it, then run it in a clean interpreter without Django."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "packaging" / "proof-agent.service"


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist") / "proof-agent.pyz"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "DEPS_FROM": "venv"}
    proc = subprocess.run(
        ["bash", str(ROOT / "packaging" / "build-agent.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return out


def _clean_run(pyz: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The base interpreter (not this venv), isolated (-I) and without site-packages (-S):
    only what is inside the .pyz can be imported."""
    base_python = (
        Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    )
    env = {"PATH": "/usr/bin:/bin", "SHIV_ROOT": str(tmp_path / "shiv"), "HOME": str(tmp_path)}
    return subprocess.run(
        [str(base_python), "-I", "-S", str(pyz), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


@pytest.mark.slow
def test_built_executable_runs_help_and_doctor_without_django(pyz: Path, tmp_path: Path) -> None:
    names = zipfile.ZipFile(pyz).namelist()
    assert any(n.startswith("site-packages/agent/cli.py") for n in names)
    assert any(n.startswith("site-packages/numpy/") for n in names)
    assert any(n.startswith("site-packages/grpc/") for n in names)
    assert not any(n.startswith("site-packages/django/") for n in names)
    assert not any("/tests/" in n and n.startswith("site-packages/agent/") for n in names)
    assert os.access(pyz, os.X_OK)

    help_run = _clean_run(pyz, tmp_path, "--help")
    assert help_run.returncode == 0, help_run.stderr
    for command in ("exec", "doctor", "run", "validate"):
        assert command in help_run.stdout

    doctor = _clean_run(pyz, tmp_path, "doctor", "--json")
    assert doctor.returncode == 0, doctor.stderr
    checks = {c["source"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["NVML"]["status"] == "unavailable"
    assert "libnvidia-ml.so.1" in checks["NVML"]["detail"]

    # the compiled dependencies really load from the unpacked executable
    exec_run = _clean_run(
        pyz,
        tmp_path,
        "exec",
        "--out",
        str(tmp_path / "t.jsonl"),
        "--",
        "/bin/sh",
        "-c",
        "echo hi; exit 4",
    )
    assert exec_run.returncode == 4 and exec_run.stdout == "hi\n"


def test_systemd_unit() -> None:
    text = UNIT.read_text()
    service = text.split("[Service]", 1)[1].split("[Install]", 1)[0]
    lines = {
        ln.split("=", 1)[0]: ln.split("=", 1)[1]
        for ln in service.splitlines()
        if "=" in ln and not ln.startswith("#")
    }
    assert lines["Restart"] == "always"
    assert lines["User"] == "root"
    assert lines["ExecStart"].startswith("/usr/local/bin/proof-agent run ")
    assert "--config /etc/proof-agent/proof-agent.toml" in lines["ExecStart"]
    assert "LimitNOFILE" in lines and "MemoryMax" in lines and "CPUQuota" in lines
    assert "[Install]" in text and "WantedBy=multi-user.target" in text
