"""The PyInstaller one-file agent (packaging/build-agent.sh FORMAT=pyinstaller): built here,
then run with no Python on PATH and no environment from this venv: `--version`, `--help`, and
`doctor` on fixture roots (real captured sysfs/procfs files, a kernel log, no GPU driver)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent import __version__

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def onefile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("PyInstaller")
    out = tmp_path_factory.mktemp("dist") / "proof-agent"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "FORMAT": "pyinstaller"}
    proc = subprocess.run(
        ["bash", str(ROOT / "packaging" / "build-agent.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _run(exe: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # No python3 on this PATH (an empty bin directory), no PYTHONPATH/VIRTUAL_ENV: only what
    # the file carries can run.
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    env = {"PATH": str(empty), "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )


def test_onefile_runs_version_help_and_doctor_on_fixture_roots(
    onefile: Path, tmp_path: Path
) -> None:
    assert os.access(onefile, os.X_OK)
    contents = subprocess.run(
        [
            sys.executable,
            "-m",
            "PyInstaller.utils.cliutils.archive_viewer",
            "-r",
            "-b",
            str(onefile),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "agent.cli" in contents and "agent.collectors.kubernetes" in contents
    assert not [n for n in contents if n.split(".")[0] in ("django", "celery", "psycopg")]
    assert not [n for n in contents if ".tests" in n and n.startswith("agent")]

    version = _run(onefile, tmp_path, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"proof-agent {__version__}"
    helped = _run(onefile, tmp_path, "--help")
    assert helped.returncode == 0 and "doctor" in helped.stdout

    sys_root = tmp_path / "sys"
    (sys_root / "class" / "infiniband" / "mlx5_0" / "ports" / "1").mkdir(parents=True)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    config = tmp_path / "proof-agent.toml"
    config.write_text(
        "[paths]\n"
        f'sys_root = "{sys_root}"\n'
        f'kmsg = "{kmsg}"\n'
        f'mountstats = "{DATA / "proc" / "mountstats_nfs.txt"}"\n'
        f'diskstats = "{DATA / "proc" / "diskstats.txt"}"\n'
        '[dcgm]\nmode = "off"\n[ebpf]\nenabled = false\n[inference]\ndiscover = false\n'
    )
    doctor = _run(onefile, tmp_path, "doctor", "--json", "--config", str(config))
    assert doctor.returncode == 0, doctor.stderr
    checks = {c["source"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["NVML"]["status"] == "unavailable"
    assert "libnvidia-ml.so.1" in checks["NVML"]["detail"]
    assert (
        checks["InfiniBand/RoCE"]["status"] == "OK"
        and "mlx5_0" in checks["InfiniBand/RoCE"]["detail"]
    )
    assert checks["kernel log"]["status"] == "OK"
    assert checks["storage (mountstats)"]["status"] == "OK"
    # A wrong config is still refused by name from inside the file.
    config.write_text("[server]\nadress = 'x'\n")
    bad = _run(onefile, tmp_path, "doctor", "--config", str(config))
    assert bad.returncode == 2 and "adress" in bad.stderr


def test_systemd_unit_gives_the_onefile_a_private_unpack_directory() -> None:
    text = (ROOT / "packaging" / "proof-agent.service").read_text()
    assert "Environment=TMPDIR=/var/lib/proof-agent/tmp" in text
    assert "ExecStartPre=/usr/bin/install -d -m 0700 /var/lib/proof-agent/tmp" in text
    assert text.index("/var/lib/proof-agent/tmp") < text.index("ExecStart=")
