import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from agent.collectors.logtail import LogTailCollector, TailSpec
from contract import limits, signals
from contract.trace import check_record

DATA = Path(__file__).parent / "data" / "training"


def lines_of(records: list[dict[str, Any]]) -> list[str]:
    return [r["line"] for r in records]


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)


def test_starts_at_end_by_default_and_follows_appends(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text("old line 1\nold line 2\nhalf of an old li")
    col = LogTailCollector([TailSpec(str(log), job="4242", rank=0)])
    assert col.collect(1.0) == []
    append(log, "ne\nnew 1\n")
    recs = col.collect(2.0)
    assert lines_of(recs) == ["new 1"]  # the tail of the line begun before we started is dropped
    r = recs[0]
    assert (r["type"], r["ts"], r["stream"], r["job"], r["rank"]) == (
        "log",
        2.0,
        "stdout",
        "4242",
        0,
    )
    assert r["file"] == str(log)
    assert check_record(r) is None


def test_from_start_and_partial_lines(tmp_path: Path) -> None:
    log = tmp_path / "job.err"
    log.write_text("a\nb\npart")
    col = LogTailCollector([TailSpec(str(log), stream="stderr")], from_start=True)
    assert lines_of(col.collect(1.0)) == ["a", "b"]
    append(log, "ial")
    assert col.collect(2.0) == []  # still no newline
    append(log, " line\r\nc\n")
    recs = col.collect(3.0)
    assert lines_of(recs) == ["partial line", "c"]
    assert {r["stream"] for r in recs} == {"stderr"}


def test_rename_rotation_reads_old_file_to_its_end_then_new(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    col = LogTailCollector([TailSpec(str(tmp_path / "train*.log"))])
    col.collect(0.0)
    append(log, "one\ntwo\n")
    assert lines_of(col.collect(1.0)) == ["one", "two"]
    append(log, "three\nunterminated")  # written just before the rotation
    os.rename(log, tmp_path / "train.log.1")
    # renamed away, not recreated yet: what is already there is read
    assert lines_of(col.collect(2.0)) == ["three"]
    append(tmp_path / "train.log.1", " tail\n")  # the writer still has the old file open
    log.write_text("four\n")  # logrotate creates the new file
    assert lines_of(col.collect(3.0)) == ["unterminated tail", "four"]
    append(log, "five\n")
    assert lines_of(col.collect(4.0)) == ["five"]
    # the rotated-out copy matches no glob here, and is never re-read as a new file
    assert lines_of(col.collect(20.0)) == []


def test_rotated_copy_matching_the_glob_is_not_read_again(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("")
    col = LogTailCollector([TailSpec(str(tmp_path / "run.log*"))], rescan_s=0)
    col.collect(0.0)
    append(log, "x1\n")
    assert lines_of(col.collect(1.0)) == ["x1"]
    os.rename(log, tmp_path / "run.log.1")
    log.write_text("y1\n")
    assert lines_of(col.collect(2.0)) == ["y1"]
    assert lines_of(col.collect(3.0)) == []


def test_copytruncate_restarts_at_zero(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    log.write_text("")
    col = LogTailCollector([TailSpec(str(log))])
    col.collect(0.0)
    append(log, "before 1\nbefore 2\n")
    assert lines_of(col.collect(1.0)) == ["before 1", "before 2"]
    with open(log, "r+b") as fh:  # what copytruncate does after copying
        fh.truncate(0)
    append(log, "after\n")
    assert lines_of(col.collect(2.0)) == ["after"]


def test_files_appearing_later_are_read_from_their_start(tmp_path: Path) -> None:
    col = LogTailCollector([TailSpec(str(tmp_path / "rank*.log"), job="77")], rescan_s=5)
    assert col.collect(0.0) == []
    (tmp_path / "rank1.log").write_text("hello from rank 1\n")
    assert col.collect(1.0) == []  # not rescanned yet
    recs = col.collect(6.0)
    assert lines_of(recs) == ["hello from rank 1"] and recs[0]["job"] == "77"


def test_parsed_fields_step_and_unknown_lines_kept(tmp_path: Path) -> None:
    log = tmp_path / "slurm-4242.out"
    log.write_text("")
    col = LogTailCollector([TailSpec(str(log), job="4242")])
    col.collect(0.0)
    src = (DATA / "nanogpt_shakespeare_char_with_checkpoint_saves.log").read_text()
    append(log, src)
    recs = col.collect(1.0)
    assert len(recs) == src.count("\n")
    assert all(check_record(r) is None for r in recs)
    by_line = {r["line"]: r for r in recs}
    assert "parsed" not in by_line["Initializing a new model from scratch"]
    it = by_line["iter 10: loss 3.4788, time 1705.53ms, mfu 0.22%"]
    assert it[signals.STEP] == 10 and it["parsed"]["loss"] == 3.4788
    assert it["parsed"]["kind"] == "progress" and it["parsed"]["framework"] == "nanogpt"
    saves = [r for r in recs if r["line"] == "saving checkpoint to out-shakespeare-char"]
    assert [r[signals.STEP] for r in saves] == [100, 200, 300, 400, 500]
    assert {r["parsed"]["kind"] for r in saves} == {"checkpoint_begin"}


def test_nan_loss_record_is_strict_json(tmp_path: Path) -> None:
    log = tmp_path / "nan.log"
    log.write_text("")
    col = LogTailCollector([TailSpec(str(log))])
    col.collect(0.0)
    append(log, (DATA / "nanogpt_minlora_fp16_nan_loss.log").read_text())
    recs = col.collect(1.0)
    nan = [r for r in recs if r["parsed"].get("loss_nonfinite") == "nan"]
    assert [r["step"] for r in nan] == [110, 120, 130, 140, 150, 160, 170, 180]
    for r in recs:
        json.dumps(r, allow_nan=False)


def test_endless_carriage_return_bar_keeps_only_latest_redraw(tmp_path: Path) -> None:
    log = tmp_path / "bar.log"
    log.write_text("")
    col = LogTailCollector([TailSpec(str(log))], max_line_bytes=200)
    col.collect(0.0)
    bar = " 50%|█████     | {}/10 [00:05<00:05,  1.00it/s]"
    append(log, "".join("\r" + bar.format(i) for i in range(1, 9)))
    assert col.collect(1.0) == []
    append(log, "\n")
    recs = col.collect(2.0)
    assert len(recs) == 1 and recs[0]["line"].endswith("8/10 [00:05<00:05,  1.00it/s]")
    assert recs[0]["step"] == 8


def test_missing_path_logs_once_and_is_picked_up_when_created(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "later.out"
    col = LogTailCollector([TailSpec(str(log))], rescan_s=0)
    with caplog.at_level(logging.WARNING):
        assert col.collect(0.0) == []
        assert col.collect(1.0) == []
    assert len([r for r in caplog.records if "not readable yet" in r.getMessage()]) == 1
    log.write_text("first\n")
    assert lines_of(col.collect(2.0)) == ["first"]


def test_add_slurm_stdout_path_reads_it_from_start(tmp_path: Path) -> None:
    out = tmp_path / "slurm-99.out"
    out.write_text(" [2024-09-03 15:54:54] iteration       10/  500000 | lm loss: 2.5E+00 |\n")
    col = LogTailCollector([])
    col.collect(0.0)
    col.add(TailSpec(str(out), job="99", rank=3))
    recs = col.collect(1.0)
    assert len(recs) == 1
    assert recs[0]["job"] == "99" and recs[0]["rank"] == 3 and recs[0]["step"] == 10
    assert recs[0]["parsed"]["loss"] == 2.5


def test_nul_bytes_invalid_utf8_and_a_26_kb_line_are_cleaned_at_collection(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(b"")
    col = LogTailCollector([TailSpec(str(log), job="dirty")])
    col.collect(0.0)
    with open(log, "ab") as fh:  # printf 'x\n\x00\x00 corrupted\n' >> job.log
        fh.write(b"x\n\x00\x00 corrupted\nbad \xff utf-8\n" + b"B" * 26_498 + b"\n")
    recs = col.collect(1.0)
    lines = lines_of(recs)
    assert lines[:3] == ["x", "\ufffd\ufffd corrupted", "bad \ufffd utf-8"]
    assert len(lines[3]) == limits.MAX_LOG_LINE_CHARS and "…[truncated " in lines[3]
    for r in recs:
        assert check_record(r) is None and "\x00" not in r["line"]
