"""`proof-agent gpu-smoke`: the smoke check for a machine with a real NVIDIA GPU (the device check
of issue 5), in one go.

    proof-agent gpu-smoke                            # JSON summary to $OUT/gpu-smoke.json
    proof-agent gpu-smoke --out DIR --seconds 10
    .venv/bin/python scripts/gpu-smoke.py --seconds 10   # the same, from a checkout

Steps (each records its own status, reason and figures; a failing step never stops the next):

1. environment: nvidia-smi -L, nvcc --version, whether torch and bcc import;
2. workload: a tiny CUDA program that launches kernels, synchronizes its stream, copies device
   → host and prints a training-style line to stderr every second, for the whole check. Built
   with nvcc when present; else the same loop through PyTorch; else through the CUDA driver API
   with ctypes (a PTX no-op kernel JIT-loaded by cuModuleLoadData). It reports the calls it made;
3. NVML: the real collector (nvidia-ml-py on the installed driver) at 1 Hz for `--seconds`
   (default 10) with the identity join (the workload runs as RANK 0 of Slurm job "smoke"),
   its node facts, every reading's last value, the readings the GPU does not support,
   events, PID → GPU, CPU per collection;
4. eBPF: the real uprobes on the real libcuda the workload maps, read every second alongside
   NVML, and the fd 1/2 capture of its stderr lines; the cuda.* series seen vs the calls made;
5. `proof-agent doctor` (every source's status and reason), in its own process;
6. the node backend from a default config (every collector, 3 intervals): records per source.

Everything fits in about 2 minutes (the budget is 5). Exit status 0 when the summary was
written (look at each step's "ok" field), 2 if it could not be written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "SLURM_JOB_ID": "smoke"}

CUDA_SOURCE = r"""
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unistd.h>
#include <cuda_runtime.h>
__global__ void step(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 0.5f + 1.0f;
}
static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 30;
    int n = 1 << 20; float *d; static float h[1024];
    if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess) { printf("error cudaMalloc\n"); return 1; }
    printf("ready %d\n", getpid()); fflush(stdout);
    long launches = 0, syncs = 0, copies = 0; int sec = 0;
    double t0 = now(), next = t0 + 1;
    while (now() - t0 < seconds) {
        for (int j = 0; j < 100; j++) { step<<<n / 256, 256>>>(d, n); launches++; }
        cudaStreamSynchronize(0); syncs++;
        cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost); copies++;
        if (now() >= next) { fprintf(stderr, "step %d | loss %.4f\n", ++sec, 2.0 / sec); next += 1; }
        usleep(5000);
    }
    printf("done {\"launches\": %ld, \"syncs\": %ld, \"memcpy_dtoh\": %ld}\n", launches, syncs, copies);
    return 0;
}
"""

TORCH_WORKLOAD = r"""
import json, os, sys, time
import torch
seconds = float(sys.argv[1])
x = torch.randn(1 << 20, device="cuda")
print("ready", os.getpid(), flush=True)
launches = syncs = copies = 0
t0 = time.time(); nxt = t0 + 1; sec = 0
while time.time() - t0 < seconds:
    for _ in range(100):
        x.mul_(0.5).add_(1.0); launches += 2
    torch.cuda.synchronize(); syncs += 1
    x[:1024].cpu(); copies += 1
    if time.time() >= nxt:
        sec += 1; nxt += 1
        print(f"step {sec} | loss {2.0 / sec:.4f}", file=sys.stderr, flush=True)
    time.sleep(0.005)
print("done " + json.dumps({"launches": launches, "syncs": syncs, "memcpy_dtoh": copies}), flush=True)
"""

# The CUDA driver API through ctypes: a PTX no-op kernel, launched with cuLaunchKernel.
DRIVER_WORKLOAD = r"""
import ctypes, json, os, sys, time
seconds = float(sys.argv[1])
cuda = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    if rc != 0:
        print(f"error {what} {rc}", flush=True); sys.exit(1)
ok(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int(); ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p(); ok(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
ptx = b".version 6.0\n.target sm_50\n.address_size 64\n.visible .entry noop()\n{\n ret;\n}\n"
mod = ctypes.c_void_p(); ok(cuda.cuModuleLoadData(ctypes.byref(mod), ptx), "cuModuleLoadData")
fn = ctypes.c_void_p(); ok(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"noop"), "cuModuleGetFunction")
dptr = ctypes.c_uint64(); ok(cuda.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(4096)), "cuMemAlloc")
host = ctypes.create_string_buffer(4096)
print("ready", os.getpid(), flush=True)
launches = syncs = copies = 0
t0 = time.time(); nxt = t0 + 1; sec = 0
while time.time() - t0 < seconds:
    for _ in range(100):
        ok(cuda.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, None, None, None), "cuLaunchKernel")
        launches += 1
    ok(cuda.cuStreamSynchronize(None), "cuStreamSynchronize"); syncs += 1
    ok(cuda.cuMemcpyDtoH_v2(host, dptr, ctypes.c_size_t(4096)), "cuMemcpyDtoH"); copies += 1
    if time.time() >= nxt:
        sec += 1; nxt += 1
        print(f"step {sec} | loss {2.0 / sec:.4f}", file=sys.stderr, flush=True)
    time.sleep(0.005)
print("done " + json.dumps({"launches": launches, "syncs": syncs, "memcpy_dtoh": copies}), flush=True)
"""


def run_cmd(argv: list[str], timeout: float = 60) -> dict[str, Any]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)  # noqa: S603 - our fixed argv: nvidia-smi, nvcc on our bundled source
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "ok": done.returncode == 0,
        "rc": done.returncode,
        "stdout": done.stdout[-8000:],
        "stderr": done.stderr[-4000:],
    }


def step(summary: dict[str, Any], name: str, fn: Any, *args: Any) -> Any:
    """Run one step; its result (or the error) goes into the summary, never raises."""
    t0 = time.monotonic()
    print(f"== {name}", flush=True)
    try:
        result = fn(*args)
    except Exception as exc:
        result = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "trace": traceback.format_exc(),
        }
    if isinstance(result, dict):
        result.setdefault("seconds", round(time.monotonic() - t0, 2))
        summary["steps"][name] = result
        print(json.dumps({k: v for k, v in result.items() if k != "trace"}, default=str)[:1500])
    return result


# --- steps -------------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    out: dict[str, Any] = {"ok": True}
    out["nvidia_smi"] = run_cmd(["nvidia-smi", "-L"], 30) if shutil.which("nvidia-smi") else None
    out["nvcc"] = run_cmd(["nvcc", "--version"], 30) if shutil.which("nvcc") else None
    for mod in ("torch", "pynvml"):
        try:
            __import__(mod)
            out[mod] = "importable"
        except Exception as exc:
            out[mod] = f"not importable: {exc}"
    try:
        from agent.ebpf._bcc import import_bcc  # the system's bcc, as the agent finds it

        out["bcc"] = f"importable ({getattr(import_bcc(), '__version__', '?')})"
    except Exception as exc:
        out["bcc"] = f"not importable: {exc}"
    return out


class Workload:
    """The tiny CUDA program, by the first of nvcc, PyTorch, ctypes + libcuda that works."""

    def __init__(self, tmp: Path, seconds: float) -> None:
        self.tmp = tmp
        self.seconds = seconds
        self.proc: subprocess.Popen[str] | None = None
        self.kind = ""
        self.tried: list[str] = []

    def argv_candidates(self) -> list[tuple[str, list[str]]]:
        out: list[tuple[str, list[str]]] = []
        nvcc = shutil.which("nvcc") or (
            "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
        )
        if nvcc:
            src = self.tmp / "smoke.cu"
            src.write_text(CUDA_SOURCE)
            binary = self.tmp / "smoke"
            built = run_cmd([nvcc, "-O2", "-o", str(binary), str(src)], 180)
            if built["ok"]:
                out.append(("nvcc", [str(binary), str(self.seconds)]))
            else:
                self.tried.append(f"nvcc build failed: {built.get('stderr') or built.get('error')}")
        else:
            self.tried.append("nvcc not found")
        torch_py = self.tmp / "torch_workload.py"
        torch_py.write_text(TORCH_WORKLOAD)
        out.append(("torch", [sys.executable, str(torch_py), str(self.seconds)]))
        driver_py = self.tmp / "driver_workload.py"
        driver_py.write_text(DRIVER_WORKLOAD)
        out.append(("ctypes-driver", [sys.executable, str(driver_py), str(self.seconds)]))
        return out

    def start(self) -> dict[str, Any]:
        for kind, argv in self.argv_candidates():
            proc = subprocess.Popen(  # noqa: S603 - the smoke workloads we wrote out or built
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, **ENV},
            )
            if proc.stdout is None:  # cannot be: opened as PIPE
                raise RuntimeError("the workload's stdout is not a pipe")
            line = proc.stdout.readline().strip()
            if line.startswith("ready"):
                self.proc, self.kind = proc, kind
                return {"ok": True, "kind": kind, "pid": proc.pid, "tried": self.tried}
            proc.kill()
            err = (proc.stderr.read() if proc.stderr else "")[-1000:]
            self.tried.append(f"{kind}: {line or 'no output'} {err}".strip())
        return {"ok": False, "kind": None, "tried": self.tried}

    def finish(self) -> dict[str, Any]:
        if self.proc is None:
            return {"ok": False, "error": "no workload ran"}
        try:
            out, err = self.proc.communicate(timeout=self.seconds + 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        made: dict[str, Any] = {}
        for line in out.splitlines():
            if line.startswith("done "):
                made = json.loads(line[5:])
        return {
            "ok": self.proc.returncode == 0,
            "rc": self.proc.returncode,
            "kind": self.kind,
            "calls_made": made,
            "stderr_tail": err[-1000:],
        }


def collect_gpu(seconds: int, workload_pid: int | None) -> dict[str, Any]:
    """NVML + identity + eBPF (uprobes and fd 1/2 capture) at 1 Hz while the workload runs."""
    import pynvml

    from agent.collectors.identity import IdentityCollector
    from agent.collectors.nvml import NvmlCollector
    from agent.ebpf.node import build_collectors

    out: dict[str, Any] = {"ok": False}
    nvml = NvmlCollector(pynvml)
    nvml_ok = nvml.start()
    out["nvml"] = {"ok": nvml_ok, "reason": nvml.unavailable_reason}
    if nvml_ok:
        out["nvml"]["facts"] = nvml.node_facts()
    ident = IdentityCollector(
        gpu_pids=nvml.pid_gpus if nvml_ok else None,
        extra_pids=(lambda: [workload_pid]) if workload_pid else None,
    )
    ebpf = build_collectors(capture_output=True)
    for c in ebpf:
        if hasattr(c, "rescan_interval_s"):
            c.rescan_interval_s = 1.0  # find the workload's libcuda within a second
    t0 = time.monotonic()
    ebpf_ok = bool(ebpf[0].start())
    out["ebpf"] = {
        "ok": ebpf_ok,
        "reason": ebpf[0].unavailable_reason,
        "load_s": round(time.monotonic() - t0, 2),
    }
    records: list[dict[str, Any]] = []
    cpu: dict[str, list[float]] = {"nvml": [], "identity": [], "ebpf": [], "ebpf_output": []}
    sources: list[tuple[str, Any]] = [("nvml", nvml)] if nvml_ok else []
    sources.append(("identity", ident))
    if ebpf_ok:
        sources += [(c.name, c) for c in ebpf]
    from agent.runtime import IdentityJoin

    join = IdentityJoin(None)
    for _ in range(seconds):
        now = time.time()
        batch: list[dict[str, Any]] = []
        for name, c in sources:
            t = time.process_time()
            got = c.collect(now)
            cpu.setdefault(name, []).append(time.process_time() - t)
            batch += got
        join.apply(batch, now)
        records += batch
        time.sleep(max(0.0, 1.0 - (time.time() - now)))
    last: dict[str, Any] = {}
    for r in records:
        if r["type"] == "sample" and r.get("gpu_index") is not None:
            last[f"gpu{r['gpu_index']} {r['name']}"] = r["value"]
    out["nvml"]["last_values"] = dict(sorted(last.items()))
    if nvml_ok:
        out["nvml"]["unsupported"] = {f"gpu{g.index}": sorted(g.disabled) for g in nvml._gpus}
        out["nvml"]["pid_gpus"] = {
            str(p): [g.index for g in refs] for p, refs in nvml.pid_gpus().items()
        }
    out["events"] = [r for r in records if r["type"] == "event"][:50]
    out["processes"] = [r for r in records if r["type"] == "process"][:20]
    cuda: Counter[str] = Counter()
    for r in records:
        probed = str(r.get("name", "")).startswith(("cuda.", "nccl."))
        if r["type"] == "sample" and probed and r.get("pid") in (workload_pid, None):
            key = r["name"] + (f"[{r['labels']}]" if r.get("labels") else "")
            cuda[key] += r["value"] if "max" not in r["name"] and "open" not in r["name"] else 0
    out["ebpf"]["series_totals_for_workload"] = dict(cuda)
    out["ebpf"]["keyed"] = [
        {k: r.get(k) for k in ("name", "pid", "gpu", "job", "rank")}
        for r in records
        if r["type"] == "sample" and str(r.get("name", "")).startswith("cuda.")
    ][:5]
    out["ebpf"]["captured_lines"] = [
        r.get("line") for r in records if r["type"] == "log" and r.get("pid") == workload_pid
    ][:10]
    out["cpu_ms_per_collect"] = {k: round(1e3 * sum(v) / len(v), 3) for k, v in cpu.items() if v}
    for c in [nvml, *ebpf]:
        with contextlib.suppress(Exception):
            c.close()
    out["ok"] = nvml_ok and ebpf_ok
    return out


def node_backend() -> dict[str, Any]:
    from agent.config import parse_config
    from agent.runtime import Agent, ManualClock, MemorySink
    from agent.runtime.node_backend import NodeBackend

    tmp = tempfile.mkdtemp(prefix="smoke-spool-")
    cfg = parse_config({"spool": {"dir": tmp}, "dcgm": {"mode": "off"}}, env={})
    backend = NodeBackend.from_config(cfg)
    sink = MemorySink()
    clock = ManualClock(time.time())
    agent = Agent(backend.collectors, sink, clock=clock, node=backend.node)
    for _ in range(3):
        agent.tick()
        time.sleep(1)
        clock.advance(1.0)
    agent.close()
    by_type = Counter(r["type"] for r in sink.records)
    names = Counter(str(r.get("name", r["type"])).split(".")[0] for r in sink.records)
    return {
        "ok": True,
        "collectors": backend.names,
        "ebpf_off_reason": backend.ebpf_reason,
        "records_by_type": dict(by_type),
        "records_by_prefix": dict(names),
        "collector_errors": agent.stats.collector_errors,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--seconds", type=int, default=10, help="NVML/eBPF collection seconds")
    parser.add_argument("--out", default=os.environ.get("OUT") or ".", help="summary folder ($OUT)")


def run(args: argparse.Namespace) -> int:
    started = time.time()
    summary: dict[str, Any] = {"started": started, "host": os.uname().nodename, "steps": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        step(summary, "environment", environment)
        work = Workload(Path(tmp), seconds=args.seconds + 25)
        started_work = step(summary, "workload_start", work.start)
        pid = started_work.get("pid") if isinstance(started_work, dict) else None
        if pid:
            time.sleep(2)  # let it map libcuda and create its context
        step(summary, "nvml_ebpf", collect_gpu, args.seconds, pid)
        step(summary, "workload", work.finish)
        step(summary, "doctor", run_cmd, [sys.executable, "-m", "agent.cli", "doctor"], 90)
        step(summary, "node_backend", node_backend)
    summary["seconds"] = round(time.time() - started, 1)
    path = Path(args.out) / "gpu-smoke.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1, default=str))
    except OSError as exc:
        print(f"cannot write {path}: {exc}", file=sys.stderr)
        return 2
    print(f"summary: {path} ({summary['seconds']} s)")
    ok = {k: v.get("ok") for k, v in summary["steps"].items()}
    print("steps ok:", ok)
    return 0
