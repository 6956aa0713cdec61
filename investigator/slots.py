"""The explanation as slots: the model chooses among the evidence, the text is composed from it.

The 270M default model, asked for prose, wrote words of its own in most rejected attempts
("machine", "shut down for maintenance") and spent ~100–180 decode steps on 220 characters
(docs/investigations.md: first-try 54%, p95 33 s). Here it writes only what the validator can
check, drawn by the grammar from what exists:

    {"lead": "e1", "also": ["e3", "t2"], "ruled_out": {"fabric": ["t7"], "storage": ["t9"]}}

- `lead`: the fact that shows the fault most directly, one of the finding's own evidence ids;
- `also`: up to `MAX_ALSO` more facts (evidence, or the findings of a check that implicates);
- `ruled_out`: per check the procedure found clear, the id that shows it (as in prose mode).

Each id stands for a clause composed here from that fact alone (`clauses`): the evidence's
note, its signal, observed and baseline values, node and rank, or the check's finding line,
with its citation. A clause is offered only if it passes the validator by itself (a note that
names another family, say, is never offered), and the joined text goes through the same
`validate.check` as prose: the validator is not loosened, the choice is narrowed to what it
accepts. What the model decides is which facts tell the story and in what order, and which
finding clears each check; it no longer writes a word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from investigator import validate
from investigator.model import Slot
from investigator.tools import ToolResult, fmt

MAX_ALSO = 2
# ~15 tokens of ids and ~40 of the JSON around them; 96 leaves room for whitespace the grammar
# allows and is still ~4 s at the slowest measured decode rate.
MAX_TOKENS = 96
PROMPT_EVIDENCE = 8
NOTE_CHARS = 120
BRIEF_NOTE_CHARS = 60
MENU_FACTS = 10  # facts offered by letter; the finding's own evidence comes first
# ids offered per clear check (its first: the clearance's own evidence, then its findings); a
# node check lists up to 12, and each line costs ~15 prompt tokens
RULED_OPTIONS = 3
_CITE_TAIL = re.compile(r"\s*\[[et]\d+\]")

SYSTEM = (
    "Proof's detectors decided the verdict below. Pick the facts that explain it; the text is "
    "written from the facts you pick. lead: the id of the fact that shows the fault most "
    "directly. also: 1 or 2 more ids that show where it happened and what it cost. ruled_out: "
    "for each check listed as clear, the id of its fact. Answer with ids only."
)


def _value(x: Any) -> str:
    if isinstance(x, bool) or x is None:
        return ""
    if isinstance(x, int | float):
        return fmt(float(x))
    return str(x)


@dataclass(frozen=True)
class Clause:
    """What one id stands for: a note and a measurement, or a check's line. A node and rank or
    a note already said by an earlier clause is not said again (four IB counters share the
    note "increase on mlx5_0 port 1; baseline: value before": said four times it reads as a
    loop, and the validator rejects it as one)."""

    id: str
    note: str
    measure: str  # "cuda.sync_ms", or a check's whole line
    where: str = ""  # "on gpu139 rank 2"
    value: str = ""  # ": 0.23, baseline 0"

    @property
    def text(self) -> str:
        return self.said(set(), set())

    def brief(self, note: bool = True) -> str:
        """As the prompt shows it: the note (or the signal, when there is no note or several
        facts share it) and the values, ~20 tokens, not ~40 (prompt evaluation is most of an
        investigation's time on CPU)."""
        head = self.note[:BRIEF_NOTE_CHARS] if self.note and note else self.measure
        return f"{head}{' ' + self.where if self.where else ''}{self.value}"

    def said(self, where_said: set[str], notes_said: set[str]) -> str:
        at = "" if not self.where or self.where in where_said else f" {self.where}"
        measure = f"{self.measure}{at}{self.value}"
        if self.note and self.note not in notes_said:
            return f"{self.note} ({measure}) [{self.id}]"
        return f"{measure} [{self.id}]"


def evidence_clause(e: dict[str, Any]) -> Clause:
    """One evidence item as a clause, every word and number its own: "share of 10-sample
    blocks in which rank 2 was the slowest (slowest rank identity on gpu139 rank 2: 1, baseline
    0.062) [e2]"."""
    note = " ".join(str(e.get("note") or "").split()).rstrip(".")
    where = " ".join(
        x
        for x in (
            f"on {e['node']}" if e.get("node") else "",
            f"rank {e['rank']}" if isinstance(e.get("rank"), int) else "",
        )
        if x
    )
    observed, baseline = _value(e.get("observed")), _value(e.get("baseline"))
    value = ""
    if observed:
        value = f": {observed}" + (f", baseline {baseline}" if baseline else "")
    if len(note) > NOTE_CHARS:
        # its first clause, when the rest only says what the baseline is ("all ranks launched
        # nothing for this long (ms) during a checkpoint save; baseline: one training step");
        # a note cut elsewhere would be a clause cut short: then the measurement alone
        head = note.split("; baseline", 1)[0]
        note = head if len(head) <= NOTE_CHARS and head != note else ""
    return Clause(str(e["id"]), note, str(e.get("signal")), where, value)


def clauses(
    verdict: dict[str, Any], steps: list[ToolResult], facts: validate.Facts
) -> dict[str, Clause]:
    """id → the clause it stands for: the finding's own evidence (first `PROMPT_EVIDENCE`, one
    per signal and note; the clearance's evidence is what ruled_out cites), then the findings of every check that
    implicates. Only clauses the validator passes alone."""
    family = str(verdict.get("family"))
    out: dict[str, Clause] = {}
    cleared = clearance_ids(verdict)
    own = [e for e in verdict.get("evidence") or [] if str(e["id"]) not in cleared]
    kinds: set[tuple[str, str]] = set()
    for e in own[:PROMPT_EVIDENCE]:
        c = evidence_clause(e)
        if (c.measure, c.note) in kinds:
            continue  # the same measure on another rank (a launch gap per rank): one is enough
        kinds.add((c.measure, c.note))
        out[c.id] = c
    for s in steps:
        if s.result == "implicated":  # a check not seen says nothing of the fault
            for f in s.findings:
                if "[" not in f.text:  # a line restating an evidence item: that item instead
                    out.setdefault(f.id, Clause(f.id, "", f"{s.check}: {f.text}"))
    return {
        cid: c
        for cid, c in out.items()
        if not validate.check_prose(c.text, family, facts, "the clause")
    }


def clearance_ids(verdict: dict[str, Any]) -> set[str]:
    """The evidence ids appended by the clearance (they clear, they do not show the fault)."""
    return {str(i) for c in verdict.get("cleared") or [] for i in c.get("evidence") or []}


def lead_ids(offered: dict[str, Clause]) -> list[str]:
    """The lead is one of the finding's own evidence items (a check's line only if none)."""
    return [i for i in offered if i.startswith("e")] or list(offered)


def answer_schema(
    lead: list[str], also: list[str], shown_by: dict[str, list[str]], ruled_ids: int
) -> dict[str, Any]:
    clear_checks = list(shown_by)
    props: dict[str, Any] = {"lead": {"enum": lead}}
    required = ["lead"]
    if also:
        props["also"] = {
            "type": "array",
            "items": {"enum": also},
            "minItems": 1,
            "maxItems": MAX_ALSO,
        }
        required.append("also")
    props["ruled_out"] = {
        "type": "object",
        "properties": {
            check: {
                "type": "array",
                "items": {"enum": shown_by[check]},
                "minItems": 1,
                "maxItems": ruled_ids,
            }
            for check in clear_checks
        },
        "required": clear_checks,
    }
    required.append("ruled_out")
    return {"type": "object", "properties": props, "required": required}


def prompt(
    verdict: dict[str, Any],
    steps: list[ToolResult],
    offered: dict[str, Clause],
    shown_by: dict[str, list[str]],
) -> list[dict[str, str]]:
    """Short: prompt evaluation dominates on CPU. The instructions are the same for every
    verdict and come first, so llama.cpp reuses their KV cache from the previous call."""
    lines = [
        f"VERDICT: {verdict['family']}: {verdict.get('title', '')}",
        f"SUMMARY: {verdict.get('summary', '')}",
        "FACTS:",
        *(c.text for c in offered.values()),
        "CHECKS:",
        *(
            f"{s.check}: {'clear ' + ', '.join(f'[{i}]' for i in shown_by[s.check]) if s.check in shown_by else s.result}"
            for s in steps
        ),
    ]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


def to_answer(raw: dict[str, Any], offered: dict[str, Clause]) -> dict[str, Any]:
    """The model's choice as the answer `validate.check` reads: the explanation is the chosen
    clauses joined (each once, lead first), `cited` the chosen ids. An id not offered (a model
    not held to the schema) is kept as a citation, so the validator names it."""
    chosen: list[str] = []
    lead = raw.get("lead")
    also = raw.get("also")
    for cid in [lead, *(also if isinstance(also, list) else [])]:
        if isinstance(cid, str) and cid not in chosen:
            chosen.append(cid)
    parts: list[str] = []
    where_said: set[str] = set()
    notes_said: set[str] = set()
    for cid in chosen:
        if cid in offered:
            c = offered[cid]
            parts.append(c.said(where_said, notes_said))
            where_said.add(c.where)
            notes_said.add(c.note)
    text = "; ".join(parts)
    first = text.split(" ", 1)[0]
    if first.isalpha() and first.islower():  # a note's first word, not a signal's name
        text = text[:1].upper() + text[1:]
    return {
        "explanation": text,
        "cited": chosen,
        "ruled_out": raw.get("ruled_out"),
        "lead": lead,
        "also": also,
    }


# The same choice read from the model's next-token scores (`LlamaCppWriter.choose`): each fact
# labelled by one letter, one decode step per choice instead of a grammar over the whole JSON.
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

CHOOSE_SYSTEM = (
    "Proof's detectors decided the verdict below. Pick the facts that explain it; the text is "
    "written from the facts you pick. Lead: the letter of the fact that shows the fault most "
    "directly. Also: a fact that shows where it happened or what it cost, then one more, or - "
    "for none. Ruled out: for a clear check, the letter of the fact that clears it."
)


@dataclass
class Menu:
    """The labelled choices: the prompt that shows them, the slots the model fills, and the
    ruled-out ids no choice is left for (one id shows that check)."""

    messages: list[dict[str, str]]
    slots: list[Slot]
    kinds: list[str]  # per slot: "lead", "also" or "ruled_out:<check>"
    forced: dict[str, list[str]]


def menu(
    verdict: dict[str, Any],
    offered: dict[str, Clause],
    lead: list[str],
    shown_by: dict[str, list[str]],
    findings: dict[str, str],
    complaint: str = "",
) -> Menu:
    """`findings`: id → its text (tool findings and evidence notes) for the ruled-out options."""
    facts = list(offered.values())[:MENU_FACTS]
    letter = {c.id: LETTERS[i] for i, c in enumerate(facts)}
    lines = [f"VERDICT: {verdict['family']}: {verdict.get('title', '')}", "FACTS:"]
    notes = [c.note for c in facts]
    lines += [f"{letter[c.id]}: {c.brief(notes.count(c.note) == 1)}" for c in facts]
    slots = [Slot("Lead", {letter[i]: i for i in lead if i in letter})]
    kinds = ["lead"]
    if len(facts) > 1:
        also = {letter[c.id]: c.id for c in facts}
        slots += [Slot("Also", also, distinct=True), Slot("Also", also, True, distinct=True)]
        kinds += ["also", "also"]
    forced: dict[str, list[str]] = {}
    next_letter = len(facts)
    check_lines: list[str] = []
    for check, ids in shown_by.items():
        if len(ids) == 1 or next_letter + min(len(ids), RULED_OPTIONS) > len(LETTERS):
            forced[check] = ids[:1]  # nothing to choose: no decode step for it
            check_lines.append(f"{check}: clear")
            continue
        options = {}
        parts = []
        for i in ids[:RULED_OPTIONS]:
            options[LETTERS[next_letter]] = i
            line = _CITE_TAIL.sub("", findings.get(i, i))[:BRIEF_NOTE_CHARS]
            parts.append(f"{LETTERS[next_letter]}: {line}")
            next_letter += 1
        check_lines.append(f"{check}: clear; " + "; ".join(parts))
        slots.append(Slot(f"Ruled out {check}", options))
        kinds.append(f"ruled_out:{check}")
    lines += ["CHECKS:", *check_lines]
    if complaint:
        lines.append(f"A previous pick was rejected: {complaint}. Pick other facts.")
    return Menu(
        [
            {"role": "system", "content": CHOOSE_SYSTEM},
            {"role": "user", "content": "\n".join(lines)},
        ],
        slots,
        kinds,
        forced,
    )


def from_choices(m: Menu, values: list[str | None]) -> dict[str, Any]:
    """The picks as the JSON answer the schema path parses to."""
    raw: dict[str, Any] = {"also": [], "ruled_out": {k: list(v) for k, v in m.forced.items()}}
    for kind, value in zip(m.kinds, values, strict=True):
        if value is None:
            continue
        if kind == "lead":
            raw["lead"] = value
        elif kind == "also":
            raw["also"].append(value)
        else:
            raw["ruled_out"][kind.split(":", 1)[1]] = [value]
    raw["ruled_out"] = [{"check": k, "evidence": v} for k, v in raw["ruled_out"].items()]
    return raw
