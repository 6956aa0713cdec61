"""One recorded run per workload program, shared by every test that asserts on it.

Each fixture runs its program (workloads.runs.RECORDED) once per session under
`proof-agent exec --out` and analyzes the trace with `proof analyze --json`
(workloads.harness); the tests then assert several things on the same run.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from workloads.harness import Run, record_exec
from workloads.runs import RECORDED

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


def _record(workdir: Path, name: str) -> Run:
    spec = RECORDED[name]
    return record_exec(name, spec.argv(workdir), workdir, timeout=spec.timeout_s)


@pytest.fixture(scope="session")
def hf_healthy(workdir: Path) -> Run:
    return _record(workdir, "hf-healthy")


@pytest.fixture(scope="session")
def hf_lr0(workdir: Path) -> Run:
    return _record(workdir, "hf-lr0")


@pytest.fixture(scope="session")
def hf_exploding(workdir: Path) -> Run:
    return _record(workdir, "hf-exploding")


@pytest.fixture(scope="session")
def hf_nan(workdir: Path) -> Run:
    return _record(workdir, "hf-nan")


@pytest.fixture(scope="session")
def lightning_rich_healthy(workdir: Path) -> Run:
    return _record(workdir, "lightning-rich-healthy")


@pytest.fixture(scope="session")
def lightning_healthy(workdir: Path) -> Run:
    return _record(workdir, "lightning-healthy")


@pytest.fixture(scope="session")
def lightning_lr0(workdir: Path) -> Run:
    return _record(workdir, "lightning-lr0")


@pytest.fixture(scope="session")
def torch_healthy(workdir: Path) -> Run:
    return _record(workdir, "torch-healthy")


@pytest.fixture(scope="session")
def torch_nan(workdir: Path) -> Run:
    return _record(workdir, "torch-nan")


@pytest.fixture(scope="session")
def ddp_healthy(workdir: Path) -> Run:
    return _record(workdir, "ddp-healthy")


@pytest.fixture(scope="session")
def ddp4_healthy(workdir: Path) -> Run:
    return _record(workdir, "ddp4-healthy")


@pytest.fixture(scope="session")
def ddp_rank_stops(workdir: Path) -> Run:
    return _record(workdir, "ddp-rank-stops")
