"""Library discovery from memory maps, the call table, and the collector's refusal path —
the parts that need no BPF."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from agent.ebpf import _bcc, bpfsys, calls, discovery
from agent.ebpf.collector import EbpfCollector
from agent.ebpf.loader import LoadedProgram, probes_source
from agent.ebpf.probe_target import Built
from contract import signals

MAPS = b"""\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1311 /usr/bin/python3.11
7f1a00000000-7f1a00200000 r-xp 00000000 fd:01 4242 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
7f1a00200000-7f1a00300000 r--p 00200000 fd:01 4242 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
7f1b00000000-7f1b00100000 r-xp 00000000 00:2f 77 /opt/my env/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2
7f1c00000000-7f1c00100000 r-xp 00000000 fd:01 91 /usr/lib/libcudart.so.12
7f1c10000000-7f1c10100000 r-xp 00000000 fd:01 92 /usr/lib/libcuda.so.1 (deleted)
7f1c20000000-7f1c20100000 r-xp 00000000 fd:01 93 /usr/lib/libnccl-net.so
7f1c30000000-7f1c30100000 rw-p 00000000 00:00 0 [heap]
7f1c40000000-7f1c40100000 r-xp 00000000 fd:02 4242 /other/libcuda.so
"""


def test_maps_yield_each_probed_library_file_once() -> None:
    found = list(discovery.parse_maps(MAPS))
    assert [(f.kind, f.device, f.inode, f.path) for f in found] == [
        ("cuda", "fd:01", 4242, "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
        (
            "nccl",
            "00:2f",
            77,
            "/opt/my env/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2",
        ),
        # same inode number on another device is another file
        ("cuda", "fd:02", 4242, "/other/libcuda.so"),
    ]


def test_libraries_of_reads_a_proc_tree_and_builds_a_path_into_the_process_root(
    tmp_path: Path,
) -> None:
    (tmp_path / "123").mkdir()
    (tmp_path / "123" / "maps").write_bytes(MAPS)
    (tmp_path / "124").mkdir()
    (tmp_path / "124" / "maps").write_bytes(MAPS.splitlines(keepends=True)[0])
    (tmp_path / "self").mkdir()
    assert sorted(discovery.list_pids(str(tmp_path))) == [123, 124]
    found = discovery.scan(str(tmp_path), [123, 124, 125])
    assert list(found) == [123]
    library = found[123][0]
    assert discovery.host_path(str(tmp_path), 123, library) == str(
        tmp_path / "123" / "root" / "usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    )
    assert discovery.process_alive(str(tmp_path), 123)
    assert not discovery.process_alive(str(tmp_path), 125)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/x/libcuda.so", "cuda"),
        ("/x/libcuda.so.1", "cuda"),
        ("libcuda.so.550.54.15", "cuda"),
        ("/x/libnccl.so.2.21.5", "nccl"),
        ("/x/libcudart.so.12", None),
        ("/x/libnccl-net.so", None),
        ("/x/libcuda.so.1.bak", None),
    ],
)
def test_library_kind(path: str, kind: str | None) -> None:
    assert calls.library_kind(path) == kind


def test_call_table_matches_the_bpf_program_and_the_vocabulary() -> None:
    source = probes_source()
    defined = set(re.findall(r"^int (\w+)\(struct pt_regs \*ctx\)", source, re.M))
    macros = re.findall(r"^(?:TIMED_CALL|NCCL_CALL)\((\w+),", source, re.M)
    defined |= {f"{m}_enter" for m in macros} | {f"{m}_leave" for m in macros}
    for kind, probes in calls.PROBES.items():
        assert probes, kind
        for probe in probes:
            for function in (probe.entry, probe.exit):
                assert function is None or function in defined, (probe, function)
    used = set(re.findall(r"\bW_([A-Z_]+)\b", source))
    assert used <= {call.name for call in calls.Call}
    assert tuple(calls.NCCL_OP_LABELS.values()) == signals.NCCL_OPS
    flags = calls.cflags()
    assert all(f"-DW_{call.name}={call.value}" in flags for call in calls.Call)


def test_a_kernel_that_refuses_bpf_disables_the_collector_with_the_reason() -> None:
    def refusing_loader() -> LoadedProgram:
        raise Exception("Failed to load BPF program launch_enter: Operation not permitted")

    collector = EbpfCollector(bpf_loader=refusing_loader, node="n")
    assert collector.collect(time.time()) == []
    assert collector.collect(time.time()) == []
    assert collector.available is False
    assert collector.unavailable_reason is not None
    assert "Operation not permitted" in collector.unavailable_reason


def test_every_probe_belongs_to_a_known_group_and_unknown_groups_are_refused() -> None:
    groups = {probe.group for probes in calls.PROBES.values() for probe in probes}
    assert groups == set(calls.PROBE_GROUPS)
    with pytest.raises(ValueError, match="launches"):
        EbpfCollector(probe_groups=("launches",))


def _aging_collector(proc_root: Path, clock: list[int]) -> EbpfCollector:
    """A collector over a fake /proc on a settable clock (ns), young_s 10 s and idle_recheck_s
    60 s, after its first rescan."""
    collector = EbpfCollector(
        proc_root=str(proc_root),
        monotonic_ns=lambda: clock[0],
        young_s=10.0,
        idle_recheck_s=60.0,
    )
    collector.rescan()
    return collector


def test_idle_processes_maps_are_reread_only_every_idle_recheck(tmp_path: Path) -> None:
    clock = [0]
    (tmp_path / "10").mkdir()
    maps = tmp_path / "10" / "maps"
    maps.write_bytes(MAPS.splitlines(keepends=True)[0])  # python only: no CUDA yet
    collector = _aging_collector(tmp_path, clock)
    assert collector.cuda_pids == set()

    # While young it is read at every rescan: CUDA initialised at 5 s is seen at once.
    clock[0] = 5 * 10**9
    maps.write_bytes(MAPS)
    collector.rescan()
    assert collector.cuda_pids == {10}

    # Once old and without probed libraries it is read again only after idle_recheck_s.
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "maps").write_bytes(MAPS.splitlines(keepends=True)[0])
    collector.rescan()
    clock[0] = 20 * 10**9
    (tmp_path / "11" / "maps").write_bytes(MAPS)
    collector.rescan()
    assert collector.cuda_pids == {10}
    clock[0] = 66 * 10**9
    collector.rescan()
    assert collector.cuda_pids == {10, 11}


def test_load_failure_hints_name_missing_privileges(monkeypatch: pytest.MonkeyPatch) -> None:
    # CapEff as /proc/self/status gives it: CAP_SYS_ADMIN is bit 21, CAP_PERFMON 38, CAP_BPF 39.
    for caps, lacking in ((0, True), (1 << 21, False), (1 << 38 | 1 << 39, False), (1 << 39, True)):
        monkeypatch.setattr(_bcc, "_effective_capabilities", lambda caps=caps: caps)
        assert ("lacks CAP_BPF" in _bcc.load_failure_hints()) is lacking, hex(caps)


def test_function_offsets_agree_with_nm_on_the_stand_in_libraries(built: Built) -> None:
    """The ELF reader that places the uprobes finds each probed function where binutils does
    (a gcc-built .so maps its text at file offset == address, so nm's address is the offset)."""
    for library, kind in ((built.libcuda, calls.CUDA), (built.libnccl, calls.NCCL)):
        wanted = {probe.symbol for probe in calls.PROBES[kind]}
        offsets = bpfsys.function_offsets(str(library), wanted)
        listing = subprocess.run(
            ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
        ).stdout
        by_nm = {
            name: int(address, 16)
            for address, kind_letter, name in (line.split() for line in listing.splitlines())
            if kind_letter == "T" and name in wanted
        }
        assert offsets == by_nm
        assert "cuLaunchKernel" in offsets or "ncclAllReduce" in offsets


def test_processes_old_at_agent_start_are_not_reread_while_the_agent_is_young(
    tmp_path: Path,
) -> None:
    """A process's age is its start time (/proc/<pid>/stat), not when the agent first saw it;
    an old process's libraries are remembered between its reads every idle_recheck_s."""
    clock = [0]
    for pid in ("10", "12"):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "maps").write_bytes(MAPS)
    # pid 10 started at boot (starttime 0 ticks): older than young_s. pid 12 has no stat file.
    (tmp_path / "10" / "stat").write_bytes(b"10 (py thon) S" + b" 0" * 19 + b" 0 0 0\n")
    collector = _aging_collector(tmp_path, clock)
    assert collector.cuda_pids == {10, 12}
    for pid in ("10", "12"):
        (tmp_path / pid / "maps").write_bytes(MAPS.splitlines(keepends=True)[0])
    clock[0] = 5 * 10**9
    collector.rescan()
    # pid 12 (no start time: first seen at 0, young until 10 s) is read again; pid 10, which
    # started long before the agent, is not: its libraries are the ones read at 0.
    assert collector.cuda_pids == {10}
    clock[0] = 61 * 10**9
    collector.rescan()
    assert collector.cuda_pids == set()
