"""Holds the model's text to the evidence: nothing published that the evidence does not back.

`Facts` collects what may be said: every number, GPU UUID, node, rank, mount, clock time and
evidence id in the verdict (its evidence, subject, interval, clearance and template text) and
in the tools' findings. `check()` then reads the model's answer and complains about

- a family or category other than the detector's (the detectors decide; the model explains),
  and a name of another family in the explanation (it may appear only as ruled out);
- a cited id (`[e3]`, `[t2]`) that does not exist, or no citation at all;
- a number, or a token with a digit in it (a node "gpu469", "gen3", a UUID), that is not
  among the facts — numbers match at the precision the text shows them (24.6 backs 24.6%
  and 25%, a share 0.246 backs 24.6%);
- a "rank N" that is not one of the job's ranks, a clock time that is no evidence's, a mount
  path that no evidence names;
- a causal claim of its own ("caused by", "because", "due to", ...): the cause is the
  detector's finding, the model states the evidence;
- the same three-word phrase three times (a small model looping);
- a ruled-out check that the procedure implicated or did not see, or one citing no evidence
  or evidence of another check.

An answer with no complaint is valid; the complaints are what the retry is told.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from investigator.tools import CHECKS, ToolResult

FAMILIES: tuple[str, ...] = (
    "sequence_imbalance",
    "slow_rank",
    "checkpoint_stall",
    "underfilled_batches",
    "numerical_divergence",
    "no_learning",
    "hardware_fault",
    "fabric_degraded",
    "collective_hang",
    "input_starvation",
    "gpu_degrading",
)
# ruled_out.check → the clearance check it contradicts when that one is implicated.
CLEARANCE_OF = {"job": "job", "node": "hardware", "fabric": "fabric", "storage": "storage"}

_CITE = re.compile(r"\[([^\]]*)\]")
_ID = re.compile(r"^[et]\d+$")
_UUID = re.compile(r"GPU-[0-9a-fA-F-]{8,}")
_TIME = re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b")
_PATH = re.compile(r"(?<![\w/])/[\w.\-/]+")
_RANK = re.compile(r"\branks?\s+(\d+)((?:\s*(?:,|and|or)\s*\d+)*)", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?")
_TOKEN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


# Words any explanation may use whatever its evidence says: grammar, and the plain verbs and
# comparisons that state a measurement ("rose", "slower", "than"). Every other word must be one
# the evidence, the verdict's text or the checks use (`unbacked_words`).
_GLUE_TEXT = """
a an the is are was were be been being has have had do does did it its this that these those
there here which who whom whose what when where while whilst of in on at to for from by with
within without into onto over under up down out off about around across after before during
since until till between among against versus vs per than then as and or but nor not no never
none nothing also still only just even so both each every all any some other others rest same
more most less least much many few several one two three four five first second last next
previous its their they them he she his her we our you your i me my
show shows showed shown rise rose risen rising fall fell fallen falling drop dropped dropping
stay stayed remain remained went go goes going ran run runs running take took taken took
lose lost losing cost costs spend spent wait waited waiting reach reached see seen saw find
found report reported record recorded measure measured observe observed stood stand keep kept
begin began start started end ended stop stopped climb climbed grow grew grown increase
increased decrease decreased change changed made make making came come become became seem
high higher highest low lower lowest fast faster fastest slow slower slowest long longer
longest short shorter shortest large larger largest small smaller smallest big bigger biggest
near nearly almost about roughly only whole entire total overall again once twice times
time job rank node gpu step value baseline median mean average can could use used using
evidence fact facts verdict detector data shows name names named
"""


def stem(word: str) -> str:
    """A crude stem, enough to match "ranks"/"rank", "throttled"/"throttle", "saves"/"save"."""
    for suffix in ("ing", "ed", "es", "ly", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


_WORD = re.compile(r"[A-Za-z]+")


def _words_of(text: str) -> list[str]:
    """The alphabetic words of `text`, lowercased; a token with a digit ("gpu469", a UUID) and
    a citation are the other rules' business."""
    bare = _CITE.sub(" ", _UUID.sub(" ", text))
    return [
        w.lower()
        for tok in _TOKEN.findall(bare)
        if not any(c.isdigit() for c in tok)
        for w in _WORD.findall(tok)
    ]


GLUE = frozenset(stem(w) for w in _GLUE_TEXT.split())


def unbacked_words(text: str, facts: Facts) -> list[str]:
    """Words of `text` that neither the evidence (its notes, signals, the verdict's text, the
    checks' findings) nor the plain glue of a sentence uses: what a small model invents
    (measured: "not upgraded to the latest version of the GPU driver", "repaired by another
    machine", "a fault in its memory" — validated by every other rule, no evidence behind
    them)."""
    seen: dict[str, None] = {}
    for w in _words_of(text):
        if len(w) > 1 and stem(w) not in facts.words and stem(w) not in GLUE:
            seen.setdefault(w, None)
    return list(seen)


@dataclass
class Facts:
    numbers: set[float] = field(default_factory=set)
    tokens: set[str] = field(default_factory=set)  # lowercased tokens with a digit
    uuids: set[str] = field(default_factory=set)
    times: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    ids: set[str] = field(default_factory=set)
    words: set[str] = field(default_factory=set)  # stems of the evidence's own words

    def add_text(self, text: str) -> None:
        self.words |= {stem(w) for w in _words_of(text)}
        for u in _UUID.findall(text):
            self.uuids.add(u.lower())
        for t in _TIME.findall(text):
            self.times.add(t)
        for p in _PATH.findall(text):
            self.paths.add(p.rstrip("/.,;"))
        rest = _UUID.sub(" ", text)
        for n in _NUMBER.findall(rest):
            self.add_number(n)
        for tok in _TOKEN.findall(rest):
            if any(c.isdigit() for c in tok):
                self.tokens.add(tok.lower().rstrip(".-"))

    def add_number(self, value: Any) -> None:
        try:
            x = float(str(value).replace(",", ""))
        except ValueError:
            return
        if math.isfinite(x):
            self.numbers.add(x)
            self.numbers.add(abs(x))
            if abs(x) <= 1.0:
                self.numbers.add(x * 100.0)  # a share, said as a percentage

    def add_value(self, value: Any) -> None:
        if isinstance(value, bool) or value is None:
            return
        if isinstance(value, int | float):
            self.add_number(value)
            self.add_text(str(value))
        elif isinstance(value, str):
            self.add_text(value)
        elif isinstance(value, dict):
            for v in value.values():
                self.add_value(v)
        elif isinstance(value, list | tuple):
            for v in value:
                self.add_value(v)

    def add_time(self, ts: Any) -> None:
        if isinstance(ts, int | float) and math.isfinite(ts) and ts > 0:
            d = datetime.fromtimestamp(float(ts), UTC)
            self.times.add(d.strftime("%H:%M:%S"))
            self.times.add(d.strftime("%H:%M"))


def collect_facts(
    verdict: dict[str, Any], tools: Iterable[ToolResult], ranks: Iterable[int] = ()
) -> Facts:
    f = Facts()
    body = {k: v for k, v in verdict.items() if k not in ("investigation", "id")}
    f.add_value(body)
    for iv in [verdict.get("interval") or {}] + [
        e.get("interval") or {} for e in verdict.get("evidence") or []
    ]:
        f.add_time(iv.get("start"))
        f.add_time(iv.get("end"))
    f.ids |= {str(e["id"]) for e in verdict.get("evidence") or []}
    for e in verdict.get("evidence") or []:
        if isinstance(e.get("rank"), int):
            f.ranks.add(int(e["rank"]))
    subject_rank = (verdict.get("subject") or {}).get("rank")
    if isinstance(subject_rank, int):
        f.ranks.add(subject_rank)
    f.ranks |= set(ranks)
    for t in tools:
        for finding in t.findings:
            f.ids.add(finding.id)
            f.add_text(finding.text)
        f.add_text(t.concluded)
    for r in f.ranks:
        f.numbers.add(float(r))
    return f


def shown_by(step: ToolResult) -> set[str]:
    """The ids that show a check: its findings, and the evidence its conclusion cites."""
    cited = {c.strip() for g in _CITE.findall(step.concluded) for c in g.split(",")}
    return {f.id for f in step.findings} | cited


def _decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


def number_backed(text: str, facts: Facts) -> bool:
    """`text` (as written) equals a fact rounded to the precision the text shows."""
    try:
        x = abs(float(text.replace(",", "")))
    except ValueError:
        return False
    places = _decimals(text)
    tol = 0.5 * 10 ** (-places) + 1e-9
    return any(abs(x - abs(n)) <= tol for n in facts.numbers)


# The detectors decide the cause; a causal claim of the model's own is the unsupported causal
# chain users of such tools complain of (measured: "GPUs that are not properly cooled", from the
# 270M model on a degrading GPU whose evidence says nothing of cooling).
_CAUSAL = re.compile(
    r"\b(?:caused by|because|due to|leads? to|led to|results? in|is a common)\b", re.IGNORECASE
)
# A three-word phrase said this often is a small model looping, not an explanation.
REPEAT_LIMIT = 3


def _repeated_phrase(text: str) -> str | None:
    words = re.findall(r"[\w.-]+", text.lower())
    counts: dict[tuple[str, ...], int] = {}
    for i in range(len(words) - 2):
        key = tuple(words[i : i + 3])
        counts[key] = counts.get(key, 0) + 1
        if counts[key] >= REPEAT_LIMIT:
            return " ".join(key)
    return None


def _other_family_named(text: str, family: str) -> list[str]:
    low = text.lower()
    return [
        other
        for other in FAMILIES
        if other != family and (other in low or other.replace("_", " ") in low)
    ]


def check_text(text: str, facts: Facts) -> list[str]:
    """Complaints about one text: unknown citations, numbers, names, ranks, times, mounts."""
    complaints: list[str] = []
    for group in _CITE.findall(text):
        for cid in (c.strip() for c in group.split(",")):
            if not _ID.match(cid):
                complaints.append(f"[{group}] is not an evidence citation (use ids like e1, t2)")
            elif cid not in facts.ids:
                complaints.append(f"cites {cid}, which does not exist")
    bare = _CITE.sub(" ", text)
    for u in _UUID.findall(bare):
        if u.lower() not in facts.uuids:
            complaints.append(f"names GPU {u}, which is not in the evidence")
    bare = _UUID.sub(" ", bare)
    for t in _TIME.findall(bare):
        if t not in facts.times:
            complaints.append(f"names the time {t}, which no evidence has")
    bare = _TIME.sub(" ", bare)
    for p in _PATH.findall(bare):
        p = p.rstrip("/.,;")
        if p and p not in facts.paths:
            complaints.append(f"names the path {p}, which no evidence names")
    bare = _PATH.sub(" ", bare)
    for m in _RANK.finditer(bare):
        named = [int(m.group(1))] + [int(x) for x in re.findall(r"\d+", m.group(2) or "")]
        for r in named:
            if r not in facts.ranks:
                complaints.append(f"names rank {r}, which is not one of the job's ranks")
    for tok in _TOKEN.findall(bare):
        if not any(c.isdigit() for c in tok):
            continue
        low = tok.lower().rstrip(".-")
        if _NUMBER.fullmatch(tok.rstrip(".")):
            if not number_backed(tok.rstrip("."), facts):
                complaints.append(f"states the number {tok.rstrip('.')}, which no evidence backs")
        elif low not in facts.tokens:
            complaints.append(f"names {tok}, which is not in the evidence")
    return complaints


def check_prose(text: str, family: str, facts: Facts, what: str) -> list[str]:
    """Complaints about a text the model wrote about a verdict of `family` (an explanation, an
    answer to a question): a cause of its own, a loop, another family's name, and every
    number, name, time and citation `check_text` holds to the evidence."""
    complaints: list[str] = []
    causal = _CAUSAL.search(text)
    if causal:
        complaints.append(
            f"states a cause of its own ({causal.group(0)!r}): the detector's finding is the "
            "cause; say only what the evidence shows"
        )
    repeated = _repeated_phrase(text)
    if repeated:
        complaints.append(f"{what} repeats {repeated!r}")
    others = _other_family_named(text, family)
    if others:
        complaints.append(f"{what} names another family ({', '.join(others)})")
    invented = unbacked_words(text, facts)
    if invented:
        shown = ", ".join(f"'{w}'" for w in invented[:6])
        complaints.append(f"{what} uses words no evidence uses ({shown}): use the facts' words")
    return complaints + check_text(text, facts)


def check(
    answer: dict[str, Any], verdict: dict[str, Any], facts: Facts, tools: Iterable[ToolResult]
) -> list[str]:
    """Every complaint about the model's answer (empty: valid)."""
    complaints: list[str] = []
    family, category = verdict.get("family"), verdict.get("category")
    if answer.get("family") != family:
        complaints.append(f"family must be {family}, not {answer.get('family')}")
    if answer.get("category") != category:
        complaints.append(f"category must be {category}, not {answer.get('category')}")
    text = str(answer.get("explanation") or "").strip()
    if len(text) < 20:
        complaints.append("the explanation is empty or too short")
    complaints += check_prose(text, str(family), facts, "the explanation")
    cited = [str(c) for c in answer.get("cited") or []]
    cited += [c.strip() for g in _CITE.findall(text) for c in g.split(",")]
    if not any(c in facts.ids for c in cited):
        complaints.append("the explanation cites no evidence id")
    for c in answer.get("cited") or []:
        if str(c) not in facts.ids:
            complaints.append(f"cites {c}, which does not exist")
    implicated = {
        c.get("check") for c in verdict.get("cleared") or [] if c.get("result") == "implicated"
    }
    tools = list(tools)
    concluded = {t.check: t.result for t in tools}
    shown = {t.check: shown_by(t) for t in tools}
    ruled = [str(r.get("check")) for r in answer.get("ruled_out") or []]
    for chk in sorted({c for c in ruled if ruled.count(c) > 1}):
        complaints.append(f"rules out {chk} more than once")
    for r in answer.get("ruled_out") or []:
        chk = str(r.get("check"))
        if chk not in CHECKS:
            complaints.append(f"ruled_out check {chk} is not one of {', '.join(CHECKS)}")
            continue
        if CLEARANCE_OF[chk] in implicated or concluded.get(chk) == "implicated":
            complaints.append(f"rules out {chk}, but the {chk} check implicates it")
        elif concluded.get(chk) != "clear":
            complaints.append(f"rules out {chk}, but the {chk} check saw no data to clear it")
        ev = [str(e) for e in r.get("evidence") or []]
        if not ev:
            complaints.append(f"ruled_out {chk} cites no evidence")
        for e in ev:
            if e not in facts.ids:
                complaints.append(f"ruled_out {chk} cites {e}, which does not exist")
            elif e not in shown.get(chk, set()):
                complaints.append(f"ruled_out {chk} cites {e}, which is not {chk} evidence")
        complaints += [f"ruled_out {chk}: {c}" for c in check_text(str(r.get("note") or ""), facts)]
    # one complaint per distinct problem, in order
    return list(dict.fromkeys(complaints))
