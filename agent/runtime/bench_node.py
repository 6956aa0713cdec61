"""`proof-agent bench`: the collection path of one 8-GPU node at 1 Hz, transport included.

What runs in the measured process, on the wall clock, at 1 Hz for `duration_s`:

- the simulated node's sources (agent.runtime.sim_backend, 8 GPUs, a healthy training job):
  NVML device fields per GPU, the whole DCGM field table (contract.dcgm_fields, per-link
  NVLink included) read by the real DcgmCollector from a simulated host engine, per-pid eBPF cuda/nccl series with op labels,
  the process table and scheduler, node counters. The simulation is computed before the
  clock starts (on a real node that work is the hardware's);
- the real file collectors on fixture roots: InfiniBand sysfs counters (the ttar fixture),
  NFS mountstats and diskstats (the proc fixtures), host CPU/memory (this machine's /proc),
  the kernel log (a file) and the log tail following a job log that a thread appends the
  lines of a real Megatron log to, twice a second (the simulated job's output);
- the agent loop with the identity join, and the real transport: GrpcSink encoding each
  interval into a protobuf Batch, appending it to the on-disk spool and streaming it to a
  loopback gRPC server that acks every batch. That server runs in a separate process (its CPU
  is not the agent's) and counts the distinct series it received.

Reported: series (as the server saw them), records, process CPU time / wall time (cores) and
peak RSS of the measured process.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import shutil
import tempfile
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agent.collectors.host import HostCollector
from agent.collectors.infiniband import InfinibandCollector
from agent.collectors.kmsg import KmsgCollector
from agent.collectors.logtail import LogTailCollector, TailSpec
from agent.collectors.storage import StorageCollector
from agent.ebpf.node import build_collectors
from agent.ebpf.probe_target import BuildError, Built, Driver, build
from agent.runtime.base import AcceleratedClock
from agent.runtime.loop import Agent
from agent.runtime.memory import peak_rss_mib, rss_mib
from agent.runtime.sim_node import SimNodeProcess
from agent.spool import Spool
from agent.transport.sink import GrpcSink
from contract.wire import ingest_pb2, ingest_pb2_grpc
from contract.wire.client import BatchSender, open_channel

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
RSS_SAMPLE_S = 10.0  # how often the run's RSS is sampled (one /proc/self/status read)
RSS_WARM_S = 60.0  # the sample that counts as "after warm-up"
JOB_LOG = DATA / "training" / "megatron_lm_core_r0.8.0_gpt3_7b_8gpu.log"


@dataclass
class NodeBench:
    gpus: int  # GPUs on the benchmarked node
    wall_s: float  # how long the agent ran
    cpu_s: float  # the agent process's CPU time (all threads)
    ticks: int  # collection intervals run
    records: int  # records the collectors produced
    peak_rss_mib: float  # the agent process's peak resident memory
    series: int = 0  # distinct series, as the loopback ingest received them
    samples_acked: int = 0  # samples the loopback ingest acknowledged
    batches_acked: int = 0  # batches the loopback ingest acknowledged
    server_cpu_s: float = 0.0  # the loopback ingest's CPU time (not counted in cpu_s)
    spool_pending: int = 0  # batches still in the spool at the end (0: all delivered)
    late_ticks: int = 0  # intervals that started late (the agent fell behind)
    collectors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    collector_cpu_s: dict[str, float] = field(default_factory=dict)
    loop_cpu_s: float = 0.0  # the agent loop's thread: collectors, join, sort, encode, cut
    rss_start_mib: float = 0.0  # resident memory when the clock started
    rss_end_mib: float = 0.0  # resident memory when the run ended (flat RSS: end ~ start)
    # RSS sampled every RSS_SAMPLE_S during the run: after the first minute (the caches and
    # gRPC's buffers filled) and the highest seen, so "flat" is read off more than two points.
    rss_warm_mib: float = 0.0
    rss_max_run_mib: float = 0.0
    dcgm_unsupported: int = 0  # (GPU, field) pairs the simulated DCGM answered NOT_SUPPORTED

    def breakdown(self) -> str:
        parts = sorted(self.collector_cpu_s.items(), key=lambda kv: -kv[1])
        per = ", ".join(f"{n} {1000 * s / max(self.ticks, 1):.2f}" for n, s in parts)
        rest = self.cpu_s - self.loop_cpu_s
        return (
            f"CPU ms per interval: agent loop thread {1000 * self.loop_cpu_s / max(self.ticks, 1):.2f}"
            f" (collectors: {per}); other threads (spool pump, gRPC sender and its C core, "
            f"the job-log writer) {1000 * rest / max(self.ticks, 1):.2f}"
        )

    @property
    def cores(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def lines(self) -> list[str]:
        return [
            f"1 simulated node x {self.gpus} GPUs at 1 Hz for {self.wall_s:.1f} s "
            f"({self.ticks} intervals, {self.late_ticks} late)",
            f"collectors: {', '.join(self.collectors)}",
            f"series: {self.series} distinct (as received by the loopback ingest)",
            f"records: {self.records}; acked {self.batches_acked} batches, "
            f"{self.samples_acked} samples; spool pending at the end: {self.spool_pending}",
            f"CPU: {self.cpu_s:.3f} s over {self.wall_s:.1f} s = {self.cores:.4f} cores "
            "(target <= 0.02)",
            f"peak RSS: {self.peak_rss_mib:.1f} MiB (target <= 64); RSS at start "
            f"{self.rss_start_mib:.1f} MiB, at end {self.rss_end_mib:.1f} MiB",
            f"RSS during the run (every {RSS_SAMPLE_S:g} s): {self.rss_warm_mib:.1f} MiB after "
            f"{RSS_WARM_S:g} s, at most {self.rss_max_run_mib:.1f} MiB",
            f"DCGM: full contract.dcgm_fields table through the DcgmCollector; "
            f"{self.dcgm_unsupported} (GPU, field) pairs NOT_SUPPORTED, skipped",
            self.breakdown(),
            f"(loopback ack server, separate process: {self.server_cpu_s:.2f} s CPU, not counted)",
            *self.notes,
        ]


# --- the loopback ack server (separate process) -----------------------------------------------


def _serve_acks(conn: Any) -> None:
    """Acks every batch; counts distinct series and samples. Reports on 'stop'."""
    series: set[tuple[Any, ...]] = set()
    counts = {"batches": 0, "samples": 0}

    class Servicer(ingest_pb2_grpc.IngestServicer):  # type: ignore[misc]
        def Register(self, request: Any, context: Any) -> Any:
            return ingest_pb2.RegisterResponse(last_sequence=0)

        def Stream(self, request_iterator: Any, context: Any) -> Any:
            for batch in request_iterator:
                s = batch.strings
                for d in batch.series:
                    i = d.identity
                    series.add(
                        (
                            s[d.name],
                            s[i.node],
                            s[i.gpu],
                            i.gpu_index,
                            i.pid,
                            s[i.job],
                            i.rank,
                            i.local_rank,
                            tuple(s[x] for x in d.labels),
                        )
                    )
                n = sum(batch.sample_counts)
                counts["batches"] += 1
                counts["samples"] += n
                yield ingest_pb2.Ack(
                    sequence=batch.sequence, status=ingest_pb2.Ack.STORED, samples=n
                )

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    ingest_pb2_grpc.add_IngestServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    conn.send(port)
    conn.recv()  # "stop"
    server.stop(grace=1)
    conn.send(
        {
            "series": len(series),
            "batches": counts["batches"],
            "samples": counts["samples"],
            "cpu_s": time.process_time(),
        }
    )


# --- 8 stand-in GPU processes for the real eBPF probes (separate process) ----------------------

# One second of a training rank's calls, roughly: kernel launches, stream syncs, copies both
# ways, the FSDP/DDP collectives, pipeline send/recv and NCCL groups, CUDA graph launches and
# a caching allocator's occasional cuMemAlloc/cuMemFree (durations in µs).
RANK_SECOND = (
    "launch 2000",
    "sync stream 20 200",
    "sync event 5 100",
    "memcpy htod 4 4194304 100",
    "memcpy dtoh 4 4194304 100",
    "nccl allreduce 20 1048576 7 300",
    "nccl allgather 10 1048576 7 200",
    "nccl reducescatter 10 1048576 7 200",
    "nccl broadcast 2 1024 7 0",
    "nccl send 4 4096 7 0",
    "nccl recv 4 4096 7 0",
    "group 4 100",
    "graph 20 0",
    "alloc 2 1048576 0",
    "say step {step} | loss {loss:.4f} | tokens/s 31250",
)


def _drive_ranks(libdir: str, driver: str, ranks: int, conn: Any) -> None:
    """Runs `ranks` stand-in GPU processes, each making RANK_SECOND's calls every second, until
    told to stop; sends their pids first."""
    built = Built(libdir=Path(libdir), driver=Path(driver))
    drivers = [Driver(built) for _ in range(ranks)]
    conn.send([d.pid for d in drivers])
    step = 0
    while not conn.poll(0):
        t0 = time.monotonic()
        step += 1
        for d in drivers:
            for line in RANK_SECOND:
                d.command(line.format(step=step, loss=2.0 / (1 + step / 100)))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    for d in drivers:
        d.close()


# --- the measured process -----------------------------------------------------------------------


class Timed:
    """A collector with its CPU time summed (one process_time() pair per collect)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.cpu_s = 0.0

    def collect(self, now: float) -> list[Any]:
        t0 = time.thread_time()  # this thread only: the transport threads run concurrently
        try:
            return self.inner.collect(now)  # type: ignore[no-any-return]
        finally:
            self.cpu_s += time.thread_time() - t0

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()


def _fixture_collectors(root: Path, notes: list[str]) -> tuple[list[Any], Path | None]:
    collectors: list[Any] = [HostCollector("/proc")]
    kmsg = root / "kmsg"
    kmsg.write_text("")
    collectors.append(KmsgCollector(kmsg, proc_root="/proc"))
    if not DATA.is_dir():
        notes.append(f"note: fixtures not found at {DATA}: IB/storage/job-log sources left out")
        return collectors, None
    # agent/tests ships with the checkout, not the zipapp: needed only where its fixtures are.
    from agent.tests.ttar import extract

    extract(DATA / "infiniband" / "sysfs_infiniband_counters_hw_counters_procfs.ttar", root / "sys")
    collectors.append(InfinibandCollector(root / "sys"))
    collectors.append(
        StorageCollector(
            root,
            mountstats_path=DATA / "proc" / "mountstats_nfs.txt",
            diskstats_path=DATA / "proc" / "diskstats.txt",
            mountinfo_path="/proc/self/mountinfo",
        )
    )
    log = root / "job-4242.out"
    log.write_text("")
    collectors.append(LogTailCollector([TailSpec(str(log), job="4242", rank=0, pid=4242)]))
    return collectors, log


def _real_ebpf(
    tmp: Path, node: str, ranks: int, ctx: Any, notes: list[str]
) -> tuple[Any, Any, list[Any]]:
    """The real eBPF collectors (uprobes + fd 1/2 capture), loaded before the clock starts, on
    `ranks` stand-in GPU processes driven from a separate process. ([], note) where BPF or a
    C compiler is missing."""
    collectors = build_collectors(node=node, capture_output=True)
    # Loaded the agent's way: bcc compiles in a short-lived child (not this process's RSS).
    if not collectors[0].start():
        notes.append(f"note: real eBPF probes left out: {collectors[0].unavailable_reason}")
        return None, None, []
    try:
        built = build(tmp / "probe_target")
    except BuildError as exc:
        notes.append(f"note: real eBPF probes left out: {exc}")
        return None, None, []
    parent, child = ctx.Pipe()
    proc = ctx.Process(
        target=_drive_ranks,
        args=(str(built.libdir), str(built.driver), ranks, child),
        name="bench-ranks",
        daemon=True,
    )
    proc.start()
    pids = parent.recv()
    for c in collectors:
        start = getattr(c, "start", None)
        if callable(start) and start() is False:
            notes.append(f"note: {c.name} did not start: {getattr(c, 'unavailable_reason', '')}")
    notes.append(
        f"real eBPF: uprobes + fd 1/2 capture on {len(pids)} stand-in GPU processes "
        f"(pids {min(pids)}..{max(pids)}), each making RANK_SECOND's calls every second"
    )
    return proc, parent, collectors


def _append_job_log(path: Path, stop: threading.Event, every_s: float = 0.5) -> None:
    lines = JOB_LOG.read_text().splitlines(keepends=True)
    i = 0
    with path.open("a") as fh:
        while not stop.wait(every_s):
            fh.write(lines[i % len(lines)])
            fh.flush()
            i += 1


def _watch_rss(stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    """(seconds since start, RSS MiB) every RSS_SAMPLE_S until `stop`."""
    t0 = time.monotonic()
    while not stop.wait(RSS_SAMPLE_S):
        samples.append((time.monotonic() - t0, rss_mib()))


def _warm_and_max(samples: list[tuple[float, float]], end_mib: float) -> tuple[float, float]:
    """RSS at the first sample at or after RSS_WARM_S (the end's if the run was shorter) and
    the highest sampled (the end included)."""
    warm = next((mib for t, mib in samples if t >= RSS_WARM_S), end_mib)
    return warm, max([mib for _t, mib in samples] + [end_mib])


def _malloc_trim() -> None:
    """glibc's malloc_trim(0): free heap pages go back to the OS (no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def bench_node(
    *,
    duration_s: float = 60.0,
    gpus: int = 8,
    scenario: str = "healthy_training",
    seed: int = 1,
    ebpf: bool = True,
) -> NodeBench:
    notes: list[str] = []
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_serve_acks, args=(child,), name="bench-ack-server", daemon=True)
    server.start()
    port = parent.recv()
    tmp = Path(tempfile.mkdtemp(prefix="proof-bench-"))
    stop_writer = threading.Event()
    ranks_proc: Any = None
    ranks_conn: Any = None
    sim_node: SimNodeProcess | None = None
    try:
        start_ts = float(int(time.time())) + 1.0
        # The simulated hardware (run, feed, DCGM host engine) lives in a child process, as
        # the driver and nv-hostengine do on a node; what the agent keeps is measured here.
        sim_node = SimNodeProcess(
            scenario, seed=seed, duration_s=duration_s, start_ts=start_ts, gpus=gpus, ctx=ctx
        )
        node = sim_node.node
        files, job_log = _fixture_collectors(tmp, notes)
        collectors = [*sim_node.collectors(), *files]
        if ebpf:
            ranks_proc, ranks_conn, probes = _real_ebpf(tmp, node, gpus, ctx, notes)
            collectors += probes
        sender = BatchSender(open_channel(f"127.0.0.1:{port}"), "bench", keep_latencies=False)
        sender.register(agent_id="bench", hostname=node, agent_version="bench")
        spool = Spool(tmp / "spool")
        sink = GrpcSink(sender, "bench", spool=spool)
        clock = AcceleratedClock(start_ts, speed=1.0)
        timed = [Timed(c) for c in collectors]
        agent = Agent(timed, sink, clock=clock, node=node)
        if job_log is not None:
            threading.Thread(
                target=_append_job_log, args=(job_log, stop_writer), daemon=True
            ).start()
        # Set-up garbage (the fixtures' parse, the probe build, the bcc child's pipes) back to
        # the OS before the clock starts: the agent's steady state is what is measured.
        gc.collect()
        _malloc_trim()
        rss_start = rss_mib()
        rss_samples: list[tuple[float, float]] = []
        stop_rss = threading.Event()
        threading.Thread(target=_watch_rss, args=(stop_rss, rss_samples), daemon=True).start()
        wall0, cpu0, loop0 = time.monotonic(), time.process_time(), time.thread_time()
        stats = agent.run(until=sim_node.end_ts)
        loop_cpu = time.thread_time() - loop0
        stop_rss.set()
        sender.flush(timeout=10)
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        stop_writer.set()
        agent.close()  # the last batch is cut, sent and acked (or left in the spool)
        pending = spool.pending_batches
        rss_end = rss_mib()
        rss_warm, rss_max = _warm_and_max(rss_samples, rss_end)
        result = NodeBench(
            gpus=gpus,
            wall_s=wall,
            cpu_s=cpu,
            ticks=stats.ticks,
            records=stats.records,
            late_ticks=stats.late_ticks,
            peak_rss_mib=peak_rss_mib(),
            spool_pending=pending,
            collectors=[c.name for c in collectors],
            notes=notes,
            collector_cpu_s={t.name: t.cpu_s for t in timed},
            loop_cpu_s=loop_cpu,
            rss_start_mib=rss_start,
            rss_end_mib=rss_end,
            rss_warm_mib=rss_warm,
            rss_max_run_mib=rss_max,
            dcgm_unsupported=sum(len(v) for v in sim_node.dcgm.unsupported_fields().values()),
        )
        parent.send("stop")
        got = parent.recv()
        result.series = got["series"]
        result.samples_acked = got["samples"]
        result.batches_acked = got["batches"]
        result.server_cpu_s = got["cpu_s"]
        return result
    finally:
        stop_writer.set()
        if sim_node is not None:
            sim_node.close()
        if ranks_proc is not None:
            ranks_conn.send("stop")
            ranks_proc.join(timeout=10)
            if ranks_proc.is_alive():
                ranks_proc.kill()
        server.join(timeout=5)
        if server.is_alive():
            server.kill()
        shutil.rmtree(tmp, ignore_errors=True)
