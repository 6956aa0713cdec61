"""`proof eval --explain` end to end over a simulated slow_rank: simulate → trace → analyze →
investigate through the endpoint writer against a real chat-completions server on loopback
(the default model's own run is the slow test in investigator/tests/test_local_model.py), and
the per-family table it prints: first-try share, fallback rate, ruled-out checks matching the
clearance, latency, CPU seconds and tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from investigator.tests.chat_server import chat_server
from proof_web.cli import main


def _pick_first(body: dict[str, Any]) -> dict[str, Any]:
    """A constrained model answering the slots schema: the first id of each enum."""
    props = body["response_format"]["json_schema"]["schema"]["properties"]
    ruled = {c: spec["items"]["enum"][:1] for c, spec in props["ruled_out"]["properties"].items()}
    return {
        "lead": props["lead"]["enum"][0],
        "also": props["also"]["items"]["enum"][1:2],
        "ruled_out": ruled,
    }


def test_eval_explain_prints_the_per_family_scores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "explain.jsonl"
    with chat_server(_pick_first) as server:
        code = main(
            [
                "eval",
                "--explain",
                "--explain-endpoint",
                server.url,
                "--explain-mode",
                "slots",
                "--scenario",
                "slow_rank",
                "--seeds",
                "1",
                "--explain-out",
                str(out),
            ]
        )
    assert code == 0
    printed = capsys.readouterr()
    header, *rows = [r for r in printed.out.splitlines() if r.split()[:1] != [""]][:3]
    assert header.split() == [
        "family", "first", "valid", "fallb", "ruled", "p50", "s", "p95", "s", "cpu", "s",
        "prompt", "compl", "n",
    ]  # fmt: skip
    fam, first, valid, fallb, ruled, *_, prompt, compl, n = rows[0].split()
    assert (fam, first, valid, fallb, n) == ("slow_rank", "1.00", "1.00", "0.00", "1")
    matching, checked = ruled.split("/")
    assert int(checked) >= 1 and matching == checked  # ruled out only what the clearance clears
    assert (prompt, compl) == ("600", "40")  # the server's usage, one attempt
    assert "load average (1 min)" in printed.out and "slow_rank" in printed.err
    # the server picks the first lead and the second id offered: the first two, in order
    assert "evidence picks were the first ones offered, in order, on 1 of 1" in printed.out
    (line,) = out.read_text().splitlines()
    record = json.loads(line)
    assert record["investigation"]["mode"] == "slots" and record["investigation"]["validated"]
    assert record["explanation"] != record["template"]


def test_eval_explain_refuses_a_public_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "--explain", "--explain-endpoint", "http://8.8.8.8:80", "--seeds", "1"])
    assert code == 2
    assert "refused" in capsys.readouterr().err
