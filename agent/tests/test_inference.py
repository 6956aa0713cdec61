import os
from pathlib import Path

import pytest

from agent.collectors.inference import (
    InferenceCollector,
    InferenceServer,
    classify,
    discover,
    server_from_cmdline,
)
from agent.tests.fileserver import serve
from contract import signals

DATA = Path(__file__).parent / "data" / "vllm"
VLLM = (DATA / "vllm_metrics_datadog_fixture.prom").read_bytes()
SGLANG = (DATA / "sglang_metrics_datadog_fixture.prom").read_bytes()


def _proc(root: Path, pid: int, argv: list[str], env: dict[str, str] | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    if env is not None:
        (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))


VLLM_CMDLINE = [
    "/usr/bin/python3",
    "/usr/local/bin/vllm",
    "serve",
    "meta/Llama",
    "--port",
    "8001",
    "--max-num-seqs",
    "128",
]


@pytest.fixture
def proc_tree(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    _proc(root, 4100, VLLM_CMDLINE)
    # an API-server worker with the same command line: same endpoint, collapsed
    _proc(root, 4105, VLLM_CMDLINE)
    _proc(
        root,
        4200,
        [
            "python",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "m",
            "--host=0.0.0.0",
            "--max_num_seqs=64",
        ],
    )
    _proc(
        root,
        5000,
        [
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "m",
            "--port",
            "30001",
            "--max-running-requests",
            "48",
        ],
    )
    _proc(
        root,
        6000,
        [
            "/usr/local/bin/text-generation-launcher",
            "--model-id",
            "m",
            "--max-concurrent-requests",
            "256",
        ],
        env={"PORT": "80"},
    )
    _proc(root, 7000, ["python", "train.py", "--port", "8000"])
    (root / "self").mkdir()
    (root / "7001").mkdir()  # a process that exited between listing and reading
    return root


def test_discovery_from_proc_cmdlines(proc_tree: Path) -> None:
    found = {s.pid or 0: s for s in discover(proc_tree)}
    assert sorted(found) == [4100, 4200, 5000, 6000]
    assert found[4100].server == "vllm" and found[4100].url == "http://127.0.0.1:8001/metrics"
    assert found[4100].max_num_seqs == 128
    assert found[4200].url == "http://127.0.0.1:8000/metrics" and found[4200].max_num_seqs == 64
    assert found[5000].server == "sglang" and found[5000].max_num_seqs == 48
    assert found[5000].url == "http://127.0.0.1:30001/metrics"
    assert found[6000].server == "tgi" and found[6000].url == "http://127.0.0.1:80/metrics"
    assert found[6000].max_num_seqs == 256


def test_command_line_variants() -> None:
    assert classify(["vllm", "serve", "x"]) == "vllm"
    assert classify(["python", "-m", "vllm.entrypoints.api_server"]) == "vllm"
    assert classify(["python", "-m", "vllm.entrypoints.cli.main"]) is None
    assert classify(["sglang", "serve"]) == "sglang"
    assert classify(["text-generation-launcher"]) == "tgi"
    assert classify(["python", "vllm_helper.py"]) is None
    tgi = server_from_cmdline(["text-generation-launcher", "--max-batch-size", "32"])
    assert tgi is not None and tgi.url.endswith(":3000/metrics") and tgi.max_num_seqs == 32
    tgi = server_from_cmdline(["text-generation-launcher", "--prometheus-port", "9000"])
    assert tgi is not None and tgi.url.endswith(":9000/metrics") and tgi.max_num_seqs is None
    sg = server_from_cmdline(["python", "-m", "sglang.launch_server"])
    assert sg is not None and sg.url == "http://127.0.0.1:30000/metrics"
    v6 = server_from_cmdline(["vllm", "serve", "m", "--host", "::1"])
    assert v6 is not None and v6.url == "http://[::1]:8000/metrics"


def test_scrapes_configured_vllm_and_sglang_endpoints() -> None:
    with serve({"/v": VLLM, "/s": SGLANG}) as base:
        col = InferenceCollector(
            node="n1",
            discover_processes=False,
            endpoints=[
                InferenceServer("vllm", f"{base}/v", pid=4100, max_num_seqs=128),
                InferenceServer("sglang", f"{base}/s", pid=5000),
            ],
        )
        records = col.collect(10.0)
    vllm = {r["name"]: r for r in records if r["pid"] == 4100}
    sgl = [r for r in records if r["pid"] == 5000]
    assert vllm[signals.INFERENCE_MAX_NUM_SEQS]["value"] == 128
    assert vllm[signals.VLLM_PREFIX_CACHE_QUERIES_TOTAL]["value"] == 117
    assert vllm[signals.VLLM_PREFIX_CACHE_HITS_TOTAL]["value"] == 64
    assert vllm[signals.VLLM_PROMPT_TOKENS_TOTAL]["value"] == 5
    assert vllm[signals.VLLM_GPU_CACHE_USAGE_PERC]["value"] == 0
    assert vllm[signals.VLLM_KV_CACHE_USAGE_PERC]["labels"] == {
        "model_name": "facebook/opt-125m",
        "server": "vllm",
    }
    assert "vllm:e2e_request_latency_seconds_sum" in vllm
    assert not any(n.endswith("_bucket") or n.endswith("_info") for n in vllm)
    assert all(r["node"] == "n1" and r["ts"] == 10.0 for r in records)
    sgl_by = {r["name"]: r for r in sgl}
    assert sgl_by[signals.VLLM_KV_CACHE_USAGE_PERC]["value"] == 0.25
    assert sgl_by[signals.VLLM_KV_CACHE_USAGE_PERC]["labels"]["server"] == "sglang"
    assert sgl_by[signals.VLLM_GENERATION_TOKENS_TOTAL]["value"] == 32
    assert sgl_by["sglang:gen_throughput"]["value"] == 425.5
    assert signals.INFERENCE_MAX_NUM_SEQS not in sgl_by


def test_discovered_server_is_scraped_on_its_port(tmp_path: Path) -> None:
    with serve({"/metrics": VLLM}) as base:
        port = base.rsplit(":", 1)[1]
        root = tmp_path / "proc"
        _proc(root, os.getpid(), ["vllm", "serve", "m", "--port", port, "--max-num-seqs", "8"])
        col = InferenceCollector(proc_root=root, rediscover_s=30)
        first = col.collect(100.0)
        assert [s.pid for s in col.servers] == [os.getpid()]
        running = [r for r in first if r["name"] == signals.VLLM_NUM_REQUESTS_RUNNING]
        assert running and running[0]["pid"] == os.getpid()
        assert [r["value"] for r in first if r["name"] == signals.INFERENCE_MAX_NUM_SEQS] == [8]
        # the process goes away: rediscovered after rediscover_s, then nothing is scraped
        (root / str(os.getpid()) / "cmdline").unlink()
        assert col.collect(110.0)  # still cached
        assert col.collect(131.0) == []
        assert col.servers == []


def test_server_down_returns_max_num_seqs_only() -> None:
    col = InferenceCollector(
        discover_processes=False,
        endpoints=[InferenceServer("vllm", "http://127.0.0.1:9/metrics", 1, 16)],
        timeout_s=0.5,
    )
    records = col.collect(1.0)
    assert [r["name"] for r in records] == [signals.INFERENCE_MAX_NUM_SEQS]


def test_configured_url_detects_the_server_kind() -> None:
    with serve({"/s": SGLANG, "/v": VLLM, "/other": b"up 1\n"}) as base:
        col = InferenceCollector(
            discover_processes=False,
            endpoints=[
                InferenceServer.from_url(f"{base}/s"),
                InferenceServer.from_url(f"{base}/v", max_num_seqs=32),
                InferenceServer.from_url(f"{base}/other"),
            ],
        )
        records = col.collect(1.0)
    running = [r for r in records if r["name"] == signals.VLLM_NUM_REQUESTS_RUNNING]
    assert sorted(r["labels"]["server"] for r in running) == ["sglang", "vllm"]
    slots = [r for r in records if r["name"] == signals.INFERENCE_MAX_NUM_SEQS]
    assert [(r["value"], r["labels"]["server"]) for r in slots] == [(32, "vllm")]
    assert not [r for r in records if r["name"] == "up"]  # not an inference server: nothing
