"""One recorded run per workload program, shared by every test that asserts on it.

Each fixture runs its program once per session under `proof-agent exec --out` and analyzes
the trace with `proof analyze --json` (workloads.harness); the tests then assert several
things on the same run. The commands are those of docs/workloads.md.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from workloads.harness import Run, program, record_exec, torchrun

WORKLOAD_MODULES = ("torch", "transformers", "lightning")


def require_workload_packages() -> None:
    missing = [m for m in WORKLOAD_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(
            f"the workloads extra is not installed ({', '.join(missing)} missing): "
            "pip install -e '.[workloads]' (scripts/test.sh installs it)"
        )


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_workload_packages()
    return tmp_path_factory.mktemp("workloads")


def _record(workdir: Path, name: str, argv: list[str], timeout: float = 300.0) -> Run:
    return record_exec(name, argv, workdir, timeout=timeout)


@pytest.fixture(scope="session")
def hf_healthy(workdir: Path) -> Run:
    out = workdir / "hf-healthy-out"
    return _record(workdir, "hf-healthy", program("hf_trainer", "--out-dir", str(out)))


@pytest.fixture(scope="session")
def hf_lr0(workdir: Path) -> Run:
    out = workdir / "hf-lr0-out"
    return _record(workdir, "hf-lr0", program("hf_trainer", "--out-dir", str(out), "--lr", "0"))


@pytest.fixture(scope="session")
def hf_exploding(workdir: Path) -> Run:
    out = workdir / "hf-exploding-out"
    argv = program("hf_trainer", "--out-dir", str(out), "--lr", "4")
    argv += ["--warmup-steps", "100", "--max-grad-norm", "0"]
    return _record(workdir, "hf-exploding", argv)


@pytest.fixture(scope="session")
def lightning_healthy(workdir: Path) -> Run:
    out = workdir / "pl-healthy-out"
    return _record(workdir, "lightning-healthy", program("lightning_run", "--out-dir", str(out)))


@pytest.fixture(scope="session")
def lightning_lr0(workdir: Path) -> Run:
    out = workdir / "pl-lr0-out"
    argv = program("lightning_run", "--out-dir", str(out), "--lr", "0")
    return _record(workdir, "lightning-lr0", argv)


@pytest.fixture(scope="session")
def torch_healthy(workdir: Path) -> Run:
    return _record(workdir, "torch-healthy", program("torch_loop"))


@pytest.fixture(scope="session")
def torch_nan(workdir: Path) -> Run:
    return _record(workdir, "torch-nan", program("torch_loop", "--nan-at-step", "150"))


@pytest.fixture(scope="session")
def ddp_healthy(workdir: Path) -> Run:
    return _record(workdir, "ddp-healthy", torchrun(2, "ddp_gloo"))


@pytest.fixture(scope="session")
def ddp_rank_stops(workdir: Path) -> Run:
    argv = torchrun(2, "ddp_gloo", "--stop-rank", "1", "--stop-at-step", "100", "--timeout-s", "20")
    return _record(workdir, "ddp-rank-stops", argv, timeout=240.0)
