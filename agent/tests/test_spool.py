"""The on-disk spool: restart survival, size cap with counted drops, crash-tail recovery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from agent.spool import HEADER_SIZE, DeadLetter, Spool, SpoolError
from contract.trace import validate_trace
from contract.wire.decode import write_trace
from contract.wire.encode import BatchBuilder


def batch(i: int, size: int = 100) -> bytes:
    return (f"batch-{i:06d}|".encode() * size)[:size]


def test_append_peek_ack_and_restart_keeps_unacked(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000) as spool:
        seqs = [spool.append(batch(i)) for i in range(30)]
        assert seqs == list(range(1, 31))
        assert [s for s, _ in spool.peek(5)] == [1, 2, 3, 4, 5]
        assert spool.peek(2, after=28) == [(29, batch(28)), (30, batch(29))]
        assert spool.ack(10) == 10
        assert spool.pop() == (11, batch(10))
        segments_before = len(list(tmp_path.glob("*.seg")))
    assert segments_before < 30 // 8 + 2  # fully acked segments were deleted
    # A new process opening the same directory sees exactly the unacked batches...
    with Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000) as spool:
        pending = spool.peek(100)
        assert pending == [(i + 1, batch(i)) for i in range(11, 30)]
        # ...and continues the sequence numbers instead of reusing them.
        assert spool.append(b"after restart") == 31
        spool.ack(31)
        assert spool.pending_batches == 0
    # Everything acked: segments gone, the sequence still continues.
    assert list(tmp_path.glob("*.seg")) == []
    with Spool(tmp_path, max_bytes=1 << 20, segment_bytes=1000) as spool:
        assert spool.append(b"x") == 32


def test_cap_drops_oldest_and_counts_every_drop(tmp_path: Path) -> None:
    frame = HEADER_SIZE + 100
    spool = Spool(tmp_path, max_bytes=10 * frame, segment_bytes=2 * frame)
    for i in range(25):
        spool.append(batch(i))
        assert spool.disk_bytes <= 10 * frame
    pending = [s for s, _ in spool.peek(100)]
    # The newest batches are kept, contiguous up to the last one appended.
    assert pending == list(range(25 - len(pending) + 1, 26))
    assert spool.dropped_batches == 25 - len(pending)
    assert spool.dropped_bytes == 100 * spool.dropped_batches
    spool.ack(pending[0])  # an acked batch is not a drop
    dropped_before = spool.dropped_batches
    spool.close()
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["dropped_batches"] == dropped_before
    reopened = Spool(tmp_path, max_bytes=10 * frame, segment_bytes=2 * frame)
    assert reopened.dropped_batches == dropped_before
    assert reopened.dropped_bytes == 100 * dropped_before
    assert [s for s, _ in reopened.peek(100)] == pending[1:]
    # Drops after the restart add to the persisted count.
    for i in range(10):
        reopened.append(batch(100 + i))
    assert reopened.dropped_batches > dropped_before
    assert reopened.stats()["dropped_batches"] == reopened.dropped_batches
    reopened.close()


@pytest.mark.parametrize("cut", ["mid_payload", "mid_header", "bad_crc"])
def test_corrupt_tail_is_truncated_on_reopen(tmp_path: Path, cut: str) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for i in range(5):
        spool.append(batch(i))
    spool.close()
    (segment,) = tmp_path.glob("*.seg")
    size = segment.stat().st_size
    frame = HEADER_SIZE + 100
    assert size == 5 * frame
    if cut == "mid_payload":
        os.truncate(segment, size - 40)
    elif cut == "mid_header":
        os.truncate(segment, 4 * frame + 7)
    else:
        data = bytearray(segment.read_bytes())
        data[-1] ^= 0xFF
        segment.write_bytes(bytes(data))
    spool = Spool(tmp_path, max_bytes=1 << 20)
    assert spool.peek(10) == [(i + 1, batch(i)) for i in range(4)]
    assert spool.truncations == 1
    assert segment.stat().st_size == 4 * frame
    # Appending after recovery continues cleanly; the damaged seq 5 is never reused.
    assert spool.append(b"new") == 6
    spool.close()
    spool = Spool(tmp_path, max_bytes=1 << 20)
    assert [s for s, _ in spool.peek(10)][:4] == [1, 2, 3, 4]
    assert spool.peek(10)[-1][1] == b"new"
    assert spool.truncations == 1
    spool.close()


def test_kill_9_loses_nothing_appended(tmp_path: Path) -> None:
    child = textwrap.dedent(
        f"""
        import sys
        from agent.spool import Spool
        spool = Spool({str(tmp_path)!r}, max_bytes=1 << 24, fsync_interval_s=3600)
        i = 0
        while True:
            seq = spool.append(b"payload-%d" % i)
            print(seq, flush=True)
            i += 1
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", child],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.stdout is not None
    confirmed = 0
    for line in proc.stdout:
        confirmed = int(line)
        if confirmed >= 500:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    spool = Spool(tmp_path, max_bytes=1 << 24)
    got = spool.peek(1_000_000)
    seqs = [s for s, _ in got]
    assert seqs[:confirmed] == list(range(1, confirmed + 1))
    assert all(data == b"payload-%d" % (s - 1) for s, data in got)
    spool.close()


def test_rejects_what_it_cannot_hold(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=8192, segment_bytes=4096)
    with pytest.raises(SpoolError, match="does not fit"):
        spool.append(b"x" * 5000)
    with pytest.raises(SpoolError, match="never appended"):
        spool.ack(3)
    spool.close()
    (tmp_path / "state.json").write_text("not json")
    with pytest.raises(SpoolError, match="not a spool state file"):
        Spool(tmp_path)


def test_concurrent_append_and_ack(tmp_path: Path) -> None:
    """The agent thread appends while the sender thread peeks and acks (the transport's use)."""

    spool = Spool(tmp_path, max_bytes=1 << 22, segment_bytes=8192)
    total = 3000
    received: list[int] = []

    def sender() -> None:
        last = 0
        while last < total:
            batch_list = spool.peek(50, after=last)
            for seq, data in batch_list:
                assert data == batch(seq, 60)
                received.append(seq)
                last = seq
            if batch_list:
                spool.ack(last)

    thread = threading.Thread(target=sender)
    thread.start()
    for i in range(1, total + 1):
        assert spool.append(batch(i, 60)) == i
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert received == list(range(1, total + 1))
    assert spool.pending_batches == 0 and spool.dropped_batches == 0
    spool.close()
    assert len(list(tmp_path.glob("*.seg"))) <= 1


def test_dead_letter_keeps_refused_batches_with_their_reason_capped(tmp_path: Path) -> None:

    builder = BatchBuilder("dl-agent")
    builder.add({"type": "log", "ts": 1767225600.0, "line": "hello", "node": "n1"})
    builder.add({"type": "sample", "ts": 1767225600.0, "name": "x", "value": 1.0, "node": "n1"})
    data = builder.build_bytes(7)
    dead = DeadLetter(tmp_path / "dl", max_batches=2, render=write_trace)
    path = dead.add(7, data, "batch 7 rejected: over the limit", agent_id="dl-agent")
    assert path is not None and path.read_bytes() == data
    (entry,) = dead.entries()
    assert entry["sequence"] == 7 and entry["reason"] == "batch 7 rejected: over the limit"
    assert entry["agent_id"] == "dl-agent" and entry["bytes"] == len(data)
    report = validate_trace(tmp_path / "dl" / entry["trace_file"])
    assert report.ok and report.counts == {"log": 1, "sample": 1}
    assert report.meta is not None and report.meta["dead_letter"]["sequence"] == 7
    dead.add(8, b"x" * 10, "r8")
    dead.add(9, b"y" * 10, "r9")  # over max_batches: the oldest goes, counted
    assert [e["sequence"] for e in dead.entries()] == [8, 9]
    assert dead.read(7) is None and dead.read(9) == b"y" * 10
    again = DeadLetter(tmp_path / "dl")  # the counts survive a restart
    assert again.stats() == {"batches": 2, "bytes": 20, "added": 3, "dropped": 1}
    memory = DeadLetter(None, max_batches=1)
    assert memory.add(1, b"a", "r") is None and memory.add(2, b"b", "r") is None
    assert [e["sequence"] for e in memory.entries()] == [2] and memory.dropped == 1
