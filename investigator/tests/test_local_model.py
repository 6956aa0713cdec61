"""The default local model (the explain extra's Gemma 3 270M GGUF, run by llama-cpp-python) on a
simulated fault: the investigation ends validated or marked fallback — never with unchecked text
published — and it runs with no network at all (a network namespace with only loopback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.tests.test_analyze import check_verdict
from investigator import slots, validate
from investigator.model import LlamaCppWriter, Slot
from investigator.run import MODE_SLOTS, investigate
from investigator.tests.conftest import Case
from investigator.tools import CHECKS

pytestmark = pytest.mark.slow


def test_a_simulated_slow_rank_is_explained_validated_or_marked_fallback(slow_rank: Case) -> None:
    inv = investigate(slow_rank.verdict, slow_rank.window, LlamaCppWriter())
    assert inv.mode == MODE_SLOTS  # the default model picks evidence; the text is composed
    assert [s.check for s in inv.steps] == list(CHECKS)
    assert inv.model == "llama.cpp:gemma-3-270m-q4_k_m.gguf"
    assert inv.validated != inv.fallback
    assert 1 <= len(inv.attempts) <= 2
    assert inv.tokens["prompt"] > 0 and inv.tokens["completion"] > 0
    facts = validate.collect_facts(
        slow_rank.verdict, inv.steps, [r.rank for r in slow_rank.window.ranks]
    )
    if inv.validated:
        assert inv.explanation != slow_rank.verdict["explanation"]
        assert validate.check_text(inv.explanation, facts) == []
        assert inv.attempts[-1].complaints == []
    else:
        assert inv.explanation == slow_rank.verdict["explanation"]
        assert all(a.complaints for a in inv.attempts)
    published = inv.apply(slow_rank.verdict)
    assert published["investigation"]["validated"] == inv.validated
    assert [s["check"] for s in published["investigation"]["steps"]] == list(CHECKS)
    check_verdict(published)  # contract/verdict_schema.json types the investigation object


def test_the_default_model_picks_one_offered_label_per_slot_reusing_the_cached_prefix() -> None:
    writer = LlamaCppWriter()
    assert writer.can_choose()
    menu = [
        Slot("Lead", {"A": "e1", "B": "e2"}),
        Slot("Also", {"A": "e1", "B": "e2", "C": "t3"}, optional=True, distinct=True),
    ]
    facts = "FACTS:\nA: loss went nan at step 50\nB: rank 3 was slowest\nC: steps 0–80 seen"
    messages = [
        {"role": "system", "content": slots.CHOOSE_SYSTEM},
        {"role": "user", "content": f"VERDICT: numerical_divergence: Loss diverged\n{facts}"},
    ]
    first = writer.choose(messages, menu)
    assert first.values[0] in ("e1", "e2") and first.values[1] in ("e1", "e2", "t3", None)
    assert first.values[1] != first.values[0]  # distinct: the lead is not offered again
    assert first.completion_tokens == 2  # one decode step per slot
    # the same instructions again: their KV cache is reused, only the rest is evaluated
    messages[1]["content"] += "\nCHECKS:\nfabric: clear"
    second = writer.choose(messages, menu)
    assert second.cached_tokens > 60 and second.prompt_tokens < first.prompt_tokens
    assert writer.choose(messages, menu).values == second.values  # greedy: reproducible


_IN_NAMESPACE = """
import errno, json, socket, sys
s = socket.socket()
s.settimeout(2)
try:
    s.connect(("192.0.2.1", 80))  # TEST-NET-1: unroutable without a route
    reached = True
except OSError as exc:
    reached = exc.errno != errno.ENETUNREACH
print(json.dumps({"outside_reachable": reached}), file=sys.stderr)
from proof_web.cli import main
sys.exit(main(["analyze", sys.argv[1], "--json", "--explain", "--no-progress"]))
"""


def test_an_investigation_completes_in_a_network_namespace_with_only_loopback(
    slow_rank: Case,
) -> None:
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"the kernel refuses a user+network namespace: {probe.stderr.strip()}")
    done = subprocess.run(
        ["unshare", "-rn", sys.executable, "-c", _IN_NAMESPACE, str(slow_rank.trace)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert '{"outside_reachable": false}' in done.stderr
    (verdict,) = json.loads(done.stdout)["verdicts"]
    assert verdict["family"] == "slow_rank"
    inv = verdict["investigation"]
    assert inv["validated"] != inv["fallback"]
    assert [s["check"] for s in inv["steps"]] == list(CHECKS)
    assert "explain 1/1 slow_rank:" in done.stderr
