"""One investigation: the procedure's four checks, the model's cited text, the validator.

    result = investigate(verdict, window, writer)
    verdict = result.apply(verdict)      # adds "investigation", replaces "explanation"

The detectors have decided the family and category; the model only explains. Its answer is
JSON constrained by a schema built for this verdict (the family and category fixed, citations
drawn from the ids that exist, ruled-out checks drawn from those the procedure found clear),
and `validate.check` holds every number, name, time and citation in it to the evidence. On a
complaint the model gets one retry with the complaint; a second failure publishes the
detector's template explanation instead, marked `fallback`. So a published explanation is
always either validated model text or the template: never unchecked text.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from engine.window import JobWindow
from investigator import slots, validate
from investigator.model import Chooser, Reply, Writer
from investigator.tools import ToolResult, run_procedure

# The answer is ~100–170 tokens; an explanation of digits and punctuation can take 180 tokens
# for its 220 characters, and at 240 five of 13 first answers ran out before closing their JSON.
MAX_TOKENS = 320
# One id per ruled-out check shows it; a second cost ~4 decode steps each and added nothing.
RULED_OUT_IDS = 1
MIN_EXPLANATION_CHARS = 60  # a bare time or family name is no explanation (measured: both)
MAX_EXPLANATION_CHARS = 220
RETRY_TEMPERATURE = 0.4
PROMPT_EVIDENCE = 8  # evidence lines shown to the model (the finding's own come first)
PROMPT_NOTE_CHARS = 50

MODE_SLOTS = "slots"
MODE_PROSE = "prose"
MODES = (MODE_SLOTS, MODE_PROSE)

_CITATIONS = re.compile(r"\s*\[[^\]]*\]")

SYSTEM = (
    "You restate a verdict on a GPU job that Proof's detectors already decided. Write 2 short "
    "sentences from its SUMMARY and EVIDENCE lines: what happened, where, and what it cost. Use "
    "only words, numbers, ranks, node names and times that the facts below contain, copied "
    "exactly; add nothing of your own (no guesses, no causes). Put the id of each fact "
    "you use in brackets, like [e1] or [t2]. Never name another failure family. In "
    "ruled_out give, for each check the procedure concluded clear, the id its line shows.\n"
    "Example (another verdict; its facts are not yours): "
    '{"explanation": "Every checkpoint save froze all ranks [e1] while write latency on the '
    'checkpoint mount rose far above its baseline [e2]; the job lost GPU-hours [e4].", '
    '"cited": ["e1", "e2", "e4"], "ruled_out": {"fabric": ["t5"]}}'
)


@dataclass
class Attempt:
    answer: dict[str, Any] | None
    complaints: list[str]
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    # CPU seconds of this process (llama.cpp's threads included) over the attempt: on a shared
    # machine `seconds` grows with the load, this much less
    cpu_seconds: float = 0.0


@dataclass
class Investigation:
    model: str
    steps: list[ToolResult]
    attempts: list[Attempt] = field(default_factory=list)
    explanation: str = ""
    validated: bool = False
    fallback: bool = False
    duration_s: float = 0.0
    ruled_out: list[dict[str, Any]] = field(default_factory=list)
    cited: list[str] = field(default_factory=list)
    error: str | None = None
    mode: str = "prose"
    offered: list[str] = field(default_factory=list)  # slots: the ids offered, in order

    @property
    def first_try_valid(self) -> bool:
        return bool(self.attempts) and not self.attempts[0].complaints

    @property
    def positional(self) -> bool | None:
        """Slots: the model's evidence picks are simply the first ones offered, in order (what a
        fixed rule would have picked); None in prose mode or when nothing was validated."""
        if self.mode != MODE_SLOTS or not self.validated:
            return None
        return self.cited == self.offered[: len(self.cited)]

    @property
    def cpu_s(self) -> float:
        return sum(a.cpu_seconds for a in self.attempts)

    @property
    def tokens(self) -> dict[str, int]:
        return {
            "prompt": sum(a.prompt_tokens for a in self.attempts),
            "completion": sum(a.completion_tokens for a in self.attempts),
        }

    def as_dict(self) -> dict[str, Any]:
        """The verdict's optional `investigation` object."""
        return {
            "model": self.model,
            "steps": [s.as_step() for s in self.steps],
            "validated": self.validated,
            "fallback": self.fallback,
            "duration_s": round(self.duration_s, 2),
            "attempts": len(self.attempts),
            "complaints": [a.complaints for a in self.attempts if a.complaints],
            "ruled_out": self.ruled_out,
            "cited": self.cited,
            "tokens": self.tokens,
            "mode": self.mode,
            **({"error": self.error} if self.error else {}),
        }

    def apply(self, verdict: dict[str, Any]) -> dict[str, Any]:
        return {**verdict, "explanation": self.explanation, "investigation": self.as_dict()}


def answer_schema(
    verdict: dict[str, Any], ids: list[str], shown_by: dict[str, list[str]]
) -> dict[str, Any]:
    """The answer's JSON schema: the detector's family and category, a bounded explanation,
    citations and ruled-out checks drawn from what exists. Every token the model writes costs
    ~0.1–0.2 s on 2 cores with the grammar, so the ruled-out checks are ids, not prose: their
    note is the procedure's own conclusion (compose()). `shown_by`: each check the procedure
    found clear → the ids that show it."""
    clear_checks = list(shown_by)
    # One key per check the procedure found clear, each taking ids of that check only: the
    # 270M default model, left an open list, ruled the same check out three times citing the
    # job's evidence (measured); a bigger model through an endpoint gets the same schema.
    ruled_out: dict[str, Any] = {
        "type": "object",
        "properties": {
            check: {
                "type": "array",
                "items": {"enum": shown_by[check]},
                "minItems": 1,
                "maxItems": RULED_OUT_IDS,
            }
            for check in clear_checks
        },
        "required": clear_checks,
    }
    return {
        "type": "object",
        "properties": {
            "explanation": {
                "type": "string",
                "minLength": MIN_EXPLANATION_CHARS,
                "maxLength": MAX_EXPLANATION_CHARS,
            },
            "cited": {"type": "array", "items": {"enum": ids}, "minItems": 1, "maxItems": 3},
            "ruled_out": ruled_out,
        },
        "required": ["explanation", "cited", "ruled_out"],
    }


def _evidence_line(e: dict[str, Any]) -> str:
    where = " ".join(
        str(x)
        for x in (
            e.get("node"),
            None if e.get("rank") is None else f"rank {e['rank']}",
        )
        if x
    )
    note = str(e.get("note") or "")[:PROMPT_NOTE_CHARS]
    return (
        f"[{e['id']}] {e['signal']} {where}: observed {e['observed']}, "
        f"baseline {e['baseline']} ({note})"
    )


def fact_lines(verdict: dict[str, Any], steps: list[ToolResult]) -> list[str]:
    """What the model is shown: the verdict, its first evidence lines, the procedure's checks
    (the same for an explanation and for a question about the incident)."""
    evidence = list(verdict.get("evidence") or [])[:PROMPT_EVIDENCE]
    return [
        f"VERDICT: family {verdict['family']}, category {verdict['category']}",
        f"TITLE: {verdict.get('title', '')}",
        f"SUMMARY: {verdict.get('summary', '')}",
        "EVIDENCE:",
        *(_evidence_line(e) for e in evidence),
        "PROCEDURE:",
        *(f"{s.check}: {s.returned} => {s.as_step()['concluded']}" for s in steps),
    ]


def prompt(verdict: dict[str, Any], steps: list[ToolResult]) -> list[dict[str, str]]:
    lines = fact_lines(verdict, steps)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


def _could_not_see(verdict: dict[str, Any]) -> str:
    text = str(verdict.get("explanation") or "")
    at = text.find(" Could not see: ")
    return text[at:] if at >= 0 else ""


def compose(
    answer: dict[str, Any], verdict: dict[str, Any], steps: list[ToolResult], *, cut: bool = True
) -> str:
    """The published text: the model's explanation, the checks it ruled out (each with the
    procedure's own conclusion and the ids the model cited for it), and the verdict's "Could not
    see: …" (design.md §7: the explanation ends with it when sources were missing). `cut`: the
    explanation may have been cut by the length limit (prose); composed clauses never are."""
    text = str(answer.get("explanation") or "").strip()
    text = (_complete_part(text) if cut else text).rstrip(".")
    cited = [str(c) for c in answer.get("cited") or []]
    if cited and not _CITATIONS.search(text):
        text += f" [{', '.join(cited)}]"  # its citations, where the text has none inline
    if text:
        text += "."
    concluded = {s.check: _reason(s.concluded) for s in steps}
    ruled = [
        f"{r['check']}: {concluded.get(str(r['check']), '')} [{', '.join(r.get('evidence') or [])}]"
        for r in answer.get("ruled_out") or []
    ]
    if ruled:
        text += " Ruled out: " + "; ".join(ruled) + "."
    return text + _could_not_see(verdict)


def _complete_part(text: str) -> str:
    """The explanation up to its last complete clause when the length limit cut it (inside a
    citation, "… outside saves [e", or mid-clause, "… from 23:07:15 0:"): text is only ever
    dropped here, never added."""
    cut_short = len(text) >= MAX_EXPLANATION_CHARS - 1
    if text.count("[") > text.count("]"):
        text = text[: text.rfind("[")].rstrip()
        cut_short = True
    if not cut_short:
        return text
    ends = [text.rfind(mark) for mark in ("; ", ". ", "] ", ", ")]
    end = max(ends)
    if end <= 0:
        return text
    return text[: end + 1].rstrip(" ;,")


def _reason(concluded: str) -> str:
    """A step's conclusion without its verdict word and citations: "no InfiniBand errors …"."""
    reason = concluded.split(":", 1)[1] if ":" in concluded else concluded
    return _CITATIONS.sub("", reason).strip().rstrip(".")


def _parse(text: str) -> dict[str, Any] | None:
    """The answer, its ruled-out checks as a list of {"check", "evidence"} (the schema's
    object of check → ids, or a list as a model not held to the schema may write)."""
    try:
        # strict=False: llama.cpp's JSON grammar lets a raw newline into a string, which strict
        # JSON refuses (measured: a complete answer with "…; b)\n" in its explanation was
        # counted "not a JSON object"); whitespace in the text is normalised below.
        value = json.loads(text, strict=False)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("explanation"), str):
        value["explanation"] = " ".join(value["explanation"].split())
    ruled = value.get("ruled_out")
    if isinstance(ruled, dict):
        value["ruled_out"] = [
            {"check": str(k), "evidence": [str(i) for i in (v if isinstance(v, list) else [v])]}
            for k, v in ruled.items()
        ]
    elif not isinstance(ruled, list):
        value["ruled_out"] = []
    return value


def _chooser(writer: Writer) -> Chooser | None:
    """The writer, if it reads a choice from the model's scores (`LlamaCppWriter.choose`)."""
    return writer if isinstance(writer, Chooser) and writer.can_choose() else None


def writer_mode(writer: Writer) -> str:
    """How a writer is asked: "slots" (choose ids; the text is composed: the default 270M
    model) or "prose" (write the explanation: a bigger model). A writer without the attribute
    writes prose."""
    mode = str(getattr(writer, "mode", MODE_PROSE))
    return mode if mode in MODES else MODE_PROSE


def investigate(
    verdict: dict[str, Any],
    window: JobWindow | None,
    writer: Writer,
    *,
    retries: int = 1,
    mode: str | None = None,
) -> Investigation:
    """Run the procedure over `window`, have `writer` explain, validate; see the module doc.
    `mode`: "slots" or "prose" (default: the writer's, `writer_mode`)."""
    t0 = time.perf_counter()
    steps = run_procedure(verdict, window)
    ranks = [r.rank for r in window.ranks] if window is not None else []
    facts = validate.collect_facts(verdict, steps, ranks)
    inv = Investigation(model=writer.name, steps=steps)
    ids = sorted(facts.ids, key=lambda i: (i[0], int(i[1:])))
    shown_by = {
        s.check: sorted(validate.shown_by(s) & facts.ids, key=lambda i: (i[0], int(i[1:])))
        for s in steps
        if s.result == "clear"
    }
    shown = {c: v for c, v in shown_by.items() if v}
    offered = (
        slots.clauses(verdict, steps, facts) if (mode or writer_mode(writer)) == MODE_SLOTS else {}
    )
    lead = slots.lead_ids(offered)
    inv.mode = MODE_SLOTS if lead else MODE_PROSE  # nothing to choose from: prose
    inv.offered = list(offered) if inv.mode == MODE_SLOTS else []
    chooser = _chooser(writer) if inv.mode == MODE_SLOTS else None
    texts = {f.id: f.text for s in steps for f in s.findings}
    texts.update(
        {str(e["id"]): slots.evidence_clause(e).brief() for e in verdict.get("evidence") or []}
    )
    complaint = ""
    if inv.mode == MODE_SLOTS:
        schema = slots.answer_schema(lead, list(offered), shown, RULED_OUT_IDS)
        messages = slots.prompt(verdict, steps, offered, shown)
        max_tokens = slots.MAX_TOKENS
    else:
        schema = answer_schema(verdict, ids, shown)
        messages = prompt(verdict, steps)
        max_tokens = MAX_TOKENS
    base = messages
    for attempt in range(1 + retries):
        a0, c0 = time.perf_counter(), time.process_time()
        temperature = RETRY_TEMPERATURE if attempt else 0.0
        try:
            # a retry samples a little: at temperature 0 the same prompt gives the same answer
            if chooser is not None:
                m = slots.menu(verdict, offered, lead, shown, texts, complaint)
                picked = chooser.choose(m.messages, m.slots, temperature)
                reply = Reply(picked.text, picked.prompt_tokens, picked.completion_tokens)
                parsed: dict[str, Any] | None = slots.from_choices(m, picked.values)
            else:
                reply = writer.write(messages, schema, max_tokens, temperature)
                parsed = _parse(reply.text)
        except Exception as exc:  # a model that cannot answer must not lose the verdict
            inv.error = f"{type(exc).__name__}: {exc}"[:300]
            break
        answer = parsed
        if answer is not None and inv.mode == MODE_SLOTS:
            answer = slots.to_answer(answer, offered)
        if answer is None:
            complaints = ["the answer is not a JSON object"]
        else:
            # The schema no longer asks for them (fixed: ~15 decode steps for nothing); a model
            # not held to the schema that writes them is still checked.
            answer.setdefault("family", verdict["family"])
            answer.setdefault("category", verdict["category"])
            complaints = validate.check(answer, verdict, facts, steps)
            if not complaints:
                complaints = validate.check_text(
                    compose(answer, verdict, steps, cut=inv.mode == MODE_PROSE), facts
                )
        inv.attempts.append(
            Attempt(
                answer,
                complaints,
                reply.prompt_tokens,
                reply.completion_tokens,
                time.perf_counter() - a0,
                time.process_time() - c0,
            )
        )
        if not complaints and answer is not None:
            inv.explanation = compose(answer, verdict, steps, cut=inv.mode == MODE_PROSE)
            inv.validated = True
            inv.ruled_out = list(answer.get("ruled_out") or [])
            inv.cited = [str(c) for c in answer.get("cited") or []]
            break
        complaint = "; ".join(complaints[:3])
        messages = [
            base[0],
            {
                "role": "user",
                "content": base[1]["content"]
                + "\nA previous answer was rejected: "
                + "; ".join(complaints[:6])
                + (
                    ". Pick other ids."
                    if inv.mode == MODE_SLOTS
                    else ". Use only the facts above, copied exactly."
                ),
            },
        ]
    if not inv.validated:
        inv.fallback = True
        inv.explanation = str(verdict.get("explanation") or "")
    inv.duration_s = time.perf_counter() - t0
    return inv
