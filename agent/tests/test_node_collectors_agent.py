"""The parsers' and file collectors' records through the real agent runtime: the Collector
protocol, the identity join (node filled, pid → job), one ordered, valid batch per tick."""

from pathlib import Path

from agent.collectors.dcgm_exporter import DcgmExporterCollector
from agent.collectors.host import HostCollector
from agent.collectors.inference import InferenceCollector, InferenceServer
from agent.collectors.infiniband import InfinibandCollector
from agent.collectors.kmsg import KmsgCollector
from agent.collectors.logtail import LogTailCollector, TailSpec
from agent.collectors.storage import StorageCollector
from agent.runtime import Agent, Collector, ManualClock, MemorySink
from agent.tests.fakeproc import write_host_files
from agent.tests.fileserver import serve
from agent.tests.ttar import extract
from contract import signals
from contract.trace import check_record

DATA = Path(__file__).parent / "data"


def test_collectors_under_the_agent_loop(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    extract(DATA / "infiniband/sysfs_infiniband_counters_hw_counters_procfs.ttar", sysfs)
    proc = tmp_path / "proc"
    write_host_files(proc)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    job_log = tmp_path / "slurm-4242.out"
    job_log.write_text("")
    routes = {
        "/dcgm": (DATA / "dcgm/dcgm_exporter_metrics_L40S_upcloud.prom").read_bytes(),
        "/vllm": (DATA / "vllm/vllm_metrics_datadog_fixture.prom").read_bytes(),
    }
    with serve(routes) as base:
        collectors: list[Collector] = [
            DcgmExporterCollector(f"{base}/dcgm"),
            InferenceCollector(
                discover_processes=False,
                endpoints=[InferenceServer("vllm", f"{base}/vllm", pid=4100, max_num_seqs=64)],
            ),
            InfinibandCollector(sysfs),
            StorageCollector(proc),
            HostCollector(proc),
            KmsgCollector(kmsg, proc_root=proc),
            LogTailCollector([TailSpec(str(job_log), job="4242", pid=4200)]),
        ]
        assert all(isinstance(c, Collector) for c in collectors)
        sink = MemorySink()
        clock = ManualClock(1_700_000_000.0)
        agent = Agent(collectors, sink, clock=clock, node="gpu-node-7")
        agent.tick()
        (proc / "stat").write_text("cpu  40 0 10 110 0 0 0 0 0 0\nbtime 1700000000\n")
        xid_line = (DATA / "xid/xid_63_row_remapper_line_ml_engineering.log").read_text()
        kmsg.write_text("3,900,5000000,-;" + xid_line)
        job_log.write_text((DATA / "training/megatron_lm_core_r0.8.0_gpt3_7b_8gpu.log").read_text())
        clock.advance(1.0)
        second = agent.tick()
    assert all(c.name not in agent._failing for c in collectors)
    assert not [r for r in sink.records if r.get("name") == signals.EVENT_COLLECTOR_ERROR]
    assert all(check_record(r) is None for r in sink.records)
    names = {r.get("name") for r in second}
    for expected in (
        signals.DCGM_FI_DEV_POWER_USAGE,
        signals.VLLM_NUM_REQUESTS_RUNNING,
        signals.INFERENCE_MAX_NUM_SEQS,
        signals.IB_PORT_XMIT_DATA,
        signals.STORAGE_READ_BYTES,
        signals.HOST_CPU_UTIL,
        signals.HOST_MEM_USED_BYTES,
        signals.EVENT_XID,
    ):
        assert expected in names, expected
    cpu = [r for r in second if r.get("name") == signals.HOST_CPU_UTIL]
    assert cpu[0]["value"] == 0.5
    # the dcgm-exporter's own Hostname is kept; every other record gets the agent's node
    assert {r["node"] for r in second if r.get("name", "").startswith("DCGM_")} == {"gpu1-wl8sg"}
    assert {r["node"] for r in second if not r.get("name", "").startswith("DCGM_")} == {
        "gpu-node-7"
    }
    logs = [r for r in second if r["type"] == "log"]
    assert len(logs) == 17 and {r["job"] for r in logs} == {"4242"}
    progress = [r for r in logs if r.get("parsed", {}).get("kind") == "progress"]
    assert [r["step"] for r in progress] == list(range(10, 101, 10))
    assert [r["ts"] for r in second] == sorted(r["ts"] for r in second)
