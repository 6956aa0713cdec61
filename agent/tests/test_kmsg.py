"""XID events from every kernel-log fixture in tests/data/xid (real captures, SOURCES.md)."""

import os
import time
from pathlib import Path
from typing import Any

import pytest

from agent.collectors.kmsg import KmsgCollector, PciMap
from contract import signals
from contract.parsers.kernel import BOOT, EPOCH, normalize_pci, parse_xid, split_prefix
from contract.trace import check_record

XID = Path(__file__).parent / "data" / "xid"


def events_from(
    name: str, *, pci_to_gpu: PciMap | None = None, proc_root: str | Path = "/proc"
) -> list[dict[str, Any]]:
    col = KmsgCollector(XID / name, replay=True, pci_to_gpu=pci_to_gpu, proc_root=proc_root)
    try:
        return col.collect(1000.0)
    finally:
        col.close()


def test_every_xid_fixture_is_covered() -> None:
    assert {p.name for p in XID.iterdir()} == {
        "dmesg_xid_119_gsp_rpc_timeout_h100_gpud_testdata.log",
        "dmesg_xid_13_31_109_gpud_readme.log",
        "dmesg_xid_13_31_119_154_h100_incident_note.log",
        "journal_xid_79_fallen_off_bus_driver_535.log",
        "kmsg_raw_format_no_xid_negative_gpud_testdata.log",
        "nvidia_bug_report_xid_79_journal_and_dmesg_zh_locale.log",
        "xid_63_row_remapper_line_ml_engineering.log",
    }


def test_xid_119_gsp_timeouts_with_learned_uuid() -> None:
    evs = events_from("dmesg_xid_119_gsp_rpc_timeout_h100_gpud_testdata.log")
    assert [e["value"] for e in evs] == [119] * 5
    assert [e["pid"] for e in evs] == [2024380, 2024380, 2024380, 1263500, 1240590]
    e = evs[0]
    assert e["type"] == "event" and e["name"] == signals.EVENT_XID and e["ts"] == 1000.0
    # learned from "NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-…" two lines earlier
    assert e["gpu"] == "GPU-509665ad-b600-ac93-3616-d754b23d636d"
    assert e["pid"] == 2024380 and e["labels"] == {
        "pci_bus_id": "0000:9b:00",
        "process": "nvidia-smi",
    }
    assert e["text"].startswith("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119")
    expected = time.mktime(time.strptime("Sun Feb 23 16:24:18 2025", "%a %b %d %H:%M:%S %Y"))
    assert e["kernel_ts"] == expected
    assert evs[2]["kernel_ts"] - e["kernel_ts"] == 12
    assert evs[4]["labels"]["process"] == "gpud"
    assert all(check_record(x) is None for x in evs)


def test_xid_13_109_31_with_unknown_pid_and_injected_map() -> None:
    uuid = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
    evs = events_from("dmesg_xid_13_31_109_gpud_readme.log", pci_to_gpu={"00000000:CB:00.0": uuid})
    assert [e["value"] for e in evs] == [13, 13, 13, 109, 31, 109]
    assert all(e["gpu"] == uuid for e in evs)
    assert "pid" not in evs[0]  # pid='<unknown>'
    assert "process" not in evs[0]["labels"]
    assert evs[3]["pid"] == 1797828 and evs[3]["labels"]["process"] == "pt_main_thread"


def test_incident_note_xid_154_without_pid() -> None:
    evs = events_from("dmesg_xid_13_31_119_154_h100_incident_note.log", pci_to_gpu=lambda bus: None)
    assert [e["value"] for e in evs] == [13, 31, 119, 154]
    assert "gpu" not in evs[0]  # no map, no announcement: the bus id is still there
    assert {e["labels"]["pci_bus_id"] for e in evs} == {"0000:97:00"}
    x154 = parse_xid(evs[3]["text"])
    assert x154 is not None and x154.pid is None
    assert x154.detail.startswith("GPU recovery action changed")


def test_journal_xid_79() -> None:
    evs = events_from("journal_xid_79_fallen_off_bus_driver_535.log")
    assert [e["value"] for e in evs] == [79]
    assert evs[0]["gpu"] == "GPU-33f5f413-57a2-5cf8-5aa0-7d60d5ee907a"
    assert evs[0]["labels"]["pci_bus_id"] == "0000:3b:00"
    year = time.localtime().tm_year
    assert evs[0]["kernel_ts"] == time.mktime((year, 9, 10, 10, 47, 46, 0, 0, -1))


def test_zh_locale_journal_and_monotonic_dmesg(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text("cpu  1 2 3 4\nbtime 1700000000\n")
    evs = events_from("nvidia_bug_report_xid_79_journal_and_dmesg_zh_locale.log", proc_root=proc)
    assert [e["value"] for e in evs] == [79, 79]
    year = time.localtime().tm_year
    assert evs[0]["kernel_ts"] == time.mktime((year, 6, 28, 2, 52, 53, 0, 0, -1))
    assert evs[1]["kernel_ts"] == pytest.approx(1700000000 + 1590188.789226)
    msg, kt = split_prefix(evs[0]["text"])
    assert msg.startswith("NVRM: Xid (PCI:0000:c2:00): 79") and kt is not None
    assert kt.kind == EPOCH


def test_bare_xid_63_line() -> None:
    evs = events_from("xid_63_row_remapper_line_ml_engineering.log")
    assert [e["value"] for e in evs] == [63]
    assert evs[0]["pid"] == 1896 and "kernel_ts" not in evs[0]
    assert evs[0]["labels"]["pci_bus_id"] == "0000:10:1c"


def test_raw_kmsg_without_xid_gives_nothing() -> None:
    f = XID / "kmsg_raw_format_no_xid_negative_gpud_testdata.log"
    assert events_from(f.name) == []
    first = f.read_text().split("\n")[0]
    msg, kt = split_prefix(first)
    assert msg == "nvidia-nvswitch2: open (major=510)"
    assert kt is not None and kt.kind == BOOT and kt.seconds == pytest.approx(206.764307)


def test_follows_new_records_only_by_default(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    src = (XID / "dmesg_xid_13_31_119_154_h100_incident_note.log").read_text().split("\n")
    kmsg.write_text(src[0] + "\n")
    col = KmsgCollector(kmsg)
    assert col.collect(1.0) == []  # the record that was already there is history
    with open(kmsg, "a") as fh:
        fh.write("6,4100,206764999,-;" + src[3].split("] ", 1)[1][:20])  # partial record
    assert col.collect(2.0) == []
    with open(kmsg, "a") as fh:
        fh.write(src[3].split("] ", 1)[1][20:] + "\n SUBSYSTEM=pci\n")
    evs = col.collect(3.0)
    assert [e["value"] for e in evs] == [154]
    col.close()


def test_unreadable_kmsg_returns_nothing(tmp_path: Path) -> None:
    col = KmsgCollector(tmp_path / "missing")
    assert col.collect(1.0) == []
    assert col.collect(2.0) == []


def test_pci_normalization() -> None:
    assert normalize_pci("00000000:9B:00.0") == "0000:9b:00"
    assert normalize_pci("0000:9b:00") == "0000:9b:00"
    assert normalize_pci("0000:10:1c") == "0000:10:1c"


def test_real_dev_kmsg() -> None:
    """This machine's /dev/kmsg (a character device: one record per read, EAGAIN at the end)."""
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    col = KmsgCollector("/dev/kmsg", replay=True)
    start = time.monotonic()
    evs = col.collect(time.time())
    assert time.monotonic() - start < 5  # non-blocking: returns at the end of the buffer
    assert col.lines_read > 0
    assert all(e["name"] == signals.EVENT_XID for e in evs)
    before = col.lines_read
    col.collect(time.time())
    assert col.lines_read - before < 50  # only what arrived since, not the buffer again
    col.close()
    tail = KmsgCollector("/dev/kmsg")  # default: new records only
    tail.collect(time.time())
    assert tail.lines_read < 50
    tail.close()
