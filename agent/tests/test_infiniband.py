from pathlib import Path

import pytest

from agent.collectors.infiniband import InfinibandCollector
from agent.tests.ttar import extract
from contract import signals
from contract.trace import check_record

DATA = Path(__file__).parent / "data" / "infiniband"


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    files = extract(DATA / "sysfs_infiniband_counters_hw_counters_procfs.ttar", tmp_path)
    assert len(files) == 54
    return tmp_path


def test_ttar_extraction_handles_eof_marker(sysfs: Path) -> None:
    guid = sysfs / "class/infiniband/mlx5_0/node_guid"
    assert guid.read_bytes() == b"0a7f:bc12:45ef:d23b"  # "…EOF": no trailing newline
    assert (sysfs / "class/infiniband/mlx5_0/ports/1/rate").read_text() == ("25 Gb/sec (1X EDR)\n")


def test_counters_from_procfs_fixture(sysfs: Path) -> None:
    records = InfinibandCollector(sysfs).collect(50.0)
    by_name = {r["name"]: r for r in records}
    assert all(check_record(r) is None for r in records)
    assert all(
        r["labels"] == {"device": "mlx5_0", "port": "1", "link_layer": "InfiniBand"}
        for r in records
    )
    # 4-byte words → bytes
    assert by_name[signals.IB_PORT_XMIT_DATA]["value"] == 2880761508848 * 4
    assert by_name[signals.IB_PORT_RCV_DATA]["value"] == 18126345378 * 4
    assert by_name[signals.IB_PORT_XMIT_WAIT]["value"] == 0
    for name in (
        signals.IB_SYMBOL_ERROR,
        signals.IB_LINK_DOWNED,
        signals.IB_LINK_ERROR_RECOVERY,
        signals.IB_PORT_RCV_ERRORS,
    ):
        assert by_name[name]["value"] == 0
    # the rest of counters/ and hw_counters/ under ib.<file>
    assert "ib.out_of_buffer" in by_name and "ib.roce_adp_retrans" in by_name
    assert "ib.unicast_xmit_packets" in by_name
    counter_files = list((sysfs / "class/infiniband/mlx5_0/ports/1").glob("*counters/*"))
    assert len(records) == len(counter_files)
    assert all(r["ts"] == 50.0 for r in records)


def test_only_normative_counters(sysfs: Path) -> None:
    records = InfinibandCollector(sysfs, all_counters=False).collect(1.0)
    assert sorted(r["name"] for r in records) == sorted(
        [
            signals.IB_PORT_XMIT_DATA,
            signals.IB_PORT_RCV_DATA,
            signals.IB_PORT_XMIT_WAIT,
            signals.IB_SYMBOL_ERROR,
            signals.IB_LINK_DOWNED,
            signals.IB_LINK_ERROR_RECOVERY,
            signals.IB_PORT_RCV_ERRORS,
        ]
    )


def test_counters_move_and_link_down_event(sysfs: Path) -> None:
    port = sysfs / "class/infiniband/mlx5_0/ports/1"
    col = InfinibandCollector(sysfs)
    col.collect(1.0)
    (port / "counters/port_xmit_data").write_text("2880761509848\n")
    (port / "counters/symbol_error").write_text("3\n")
    (port / "hw_counters/out_of_buffer").write_text("N/A (not available)\n")
    (port / "state").write_text("1: DOWN\n")
    records = col.collect(2.0)
    by_name = {r["name"]: r for r in records if r["type"] == "sample"}
    assert by_name[signals.IB_PORT_XMIT_DATA]["value"] == 2880761509848 * 4
    assert by_name[signals.IB_SYMBOL_ERROR]["value"] == 3
    assert "ib.out_of_buffer" not in by_name
    events = [r for r in records if r["type"] == "event"]
    assert len(events) == 1 and events[0]["name"] == signals.EVENT_LINK_DOWN
    assert events[0]["text"] == "mlx5_0 port 1: 4: ACTIVE -> 1: DOWN"
    assert not [r for r in col.collect(3.0) if r["type"] == "event"]


def test_no_infiniband_returns_nothing(tmp_path: Path) -> None:
    assert InfinibandCollector(tmp_path).collect(1.0) == []
