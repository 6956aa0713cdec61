"""CPU cost of one collect() of each file/HTTP collector on the fixtures, and what that is in
cores at one collect per second (the agent's whole budget is 0.02 cores).

    .venv/bin/python -m agent.tests.bench_node_collectors
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from agent.collectors.dcgm_exporter import DcgmExporterCollector
from agent.collectors.host import HostCollector
from agent.collectors.inference import InferenceServer, map_scrape
from agent.collectors.infiniband import InfinibandCollector
from agent.collectors.kmsg import KmsgCollector
from agent.collectors.logtail import LogTailCollector, TailSpec
from agent.collectors.storage import StorageCollector
from agent.tests.ttar import extract
from contract.parsers.prometheus import ParseCache, parse_text

DATA = Path(__file__).parent / "data"


def cost(label: str, fn: Callable[[], object], n: int = 300) -> None:
    fn()
    start = time.process_time()
    for _ in range(n):
        fn()
    per = (time.process_time() - start) / n
    print(f"{label:<52} {per * 1e6:9.1f} us/collect = {per:.5f} cores at 1 Hz")


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    try:
        sysfs = tmp / "sys"
        extract(DATA / "infiniband/sysfs_infiniband_counters_hw_counters_procfs.ttar", sysfs)
        proc = tmp / "proc"
        (proc / "self").mkdir(parents=True)
        shutil.copy(DATA / "proc/mountstats_nfs.txt", proc / "self/mountstats")
        shutil.copy(DATA / "proc/diskstats.txt", proc / "diskstats")
        shutil.copy("/proc/self/mountinfo", proc / "self/mountinfo")
        logs = []
        for i in range(8):
            p = tmp / f"rank{i}.log"
            p.write_text("")
            logs.append(TailSpec(str(p), rank=i))
        kmsg = tmp / "kmsg"
        kmsg.write_text("")
        # an 8-GPU dcgm-exporter page: the L40S scrape with the GPU label varied
        l40s = (DATA / "dcgm/dcgm_exporter_metrics_L40S_upcloud.prom").read_text()
        eight = "\n".join(
            l40s.replace('gpu="0"', f'gpu="{i}"').replace("-25f2a83cdc43", f"-25f2a83cdc4{i}")
            for i in range(8)
        )
        vllm = (DATA / "vllm/vllm_metrics_datadog_fixture.prom").read_text()
        dcgm = DcgmExporterCollector(fetch=lambda url, t: eight)
        srv = InferenceServer("vllm", "u", 1)
        pcache = ParseCache()  # what the collector's Scraper keeps between scrapes
        cost(
            "InfiniBand: 1 port, 47 counters (sysfs fixture)",
            lambda: InfinibandCollector(sysfs).collect(1.0),
        )
        ib = InfinibandCollector(sysfs)
        cost("InfiniBand (reused collector)", lambda: ib.collect(1.0))
        st = StorageCollector(proc)
        cost("storage: mountstats + diskstats + mountinfo", lambda: st.collect(1.0))
        host = HostCollector("/proc")
        cost("host: /proc/stat + /proc/meminfo (live)", lambda: host.collect(1.0))
        km = KmsgCollector(kmsg)
        cost("kmsg: nothing new (file)", lambda: km.collect(1.0))
        if Path("/dev/kmsg").exists():
            kd = KmsgCollector("/dev/kmsg")
            cost("kmsg: nothing new (/dev/kmsg)", lambda: kd.collect(1.0))
        lt = LogTailCollector(logs)
        cost("logtail: 8 files, nothing new", lambda: lt.collect(1.0))
        cost(
            f"dcgm-exporter: parse+map 8 GPUs ({len(eight.splitlines())} lines)",
            lambda: dcgm.collect(1.0),
        )
        cost(
            f"vLLM: parse+map /metrics ({len(vllm.splitlines())} lines)",
            lambda: map_scrape(parse_text(vllm, pcache), srv, 1.0),
        )
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
