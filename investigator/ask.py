""" "Ask about this incident": a question answered by the same checks and the same validator.

    answer = ask(question, verdict, window, writer)

The question is answered from what the explanation is written from — the verdict, its
evidence and the procedure's four checks (`tools.run_procedure` over the same window) — and
the answer is held to it by the same validator (`validate.check_prose`): every number, GPU,
rank, node, mount, time and cited id must be in the evidence, no cause of the model's own, no
other family named. What the evidence cannot answer is refused, plainly ("The evidence does
not say …"), in three places:

1. before any model runs, when the question is about something the evidence never mentions
   (`out_of_scope`: its content words are not the evidence's, nor the words of the domain it
   covers — "will it rain", "the customer's credit card");
2. when the model itself says the facts do not answer it (`answerable: false`);
3. when its answer fails the validator twice (one retry with the complaint): the refusal then
   names the complaint. An unchecked claim is never published.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from engine.window import JobWindow
from investigator import validate
from investigator.model import Writer
from investigator.run import RETRY_TEMPERATURE, Attempt, fact_lines
from investigator.tools import ToolResult, run_procedure

MAX_QUESTION_CHARS = 500
MIN_ANSWER_CHARS = 20
MAX_ANSWER_CHARS = 240
# An answer is one or two sentences (~60–120 tokens with its ids); the JSON around it ~15.
MAX_TOKENS = 200

SYSTEM = (
    "You answer a question about an incident on a GPU job that Proof's detectors already "
    "decided. Answer in 1 or 2 short sentences using only words, numbers, ranks, node names and "
    "times that the facts below contain, copied exactly; add nothing of your own. Put the id of "
    "each fact you use in brackets, like [e1] or [t2]. Say what the evidence shows, not why. If "
    "the facts do not answer the question, set answerable to false.\n"
    # Another family's example: copied verbatim onto this incident, its words fail the
    # vocabulary rule (measured: a generic "slowest rank" example was copied and passed).
    "Example (another incident; its facts are not yours): QUESTION: How long did the "
    'checkpoint saves take? {"answerable": true, "answer": "Every checkpoint save froze all '
    'ranks while write latency on the checkpoint mount rose far above its baseline [e2].", '
    '"cited": ["e2"]}'
)

# Words that carry no topic: a question made only of these and unknown words is off-topic.
_STOPWORD_TEXT = """
a an the is are was were be been being am do does did doing done have has had having what which
who whom whose why how when where will would could should can may might must shall it its this
that these those there here of in on at to for from by with about into over under after before
during between through and or but not no nor so than then as if any some all each every me my i
you your we our us they them their he she his her him tell explain show please give say says
said know knew think mean means happen happened happening going get got make made see seen look
anything something nothing thing things more most much many very just also only still yet again
up down out off else ever really incident verdict question answer proof yes okay ok hi hello
thanks since
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
# The domain the evidence covers, beyond the words of this incident's own evidence: what one
# may sensibly ask about a GPU job's incident (the check may still find the facts silent).
_DOMAIN_TEXT = """
gpu rank node job step loss slow slower slowest fast faster speed clock sm throttle throttled
throttling xid ecc error fault hardware fabric infiniband ib nccl collective network link port
storage mount checkpoint disk latency throughput write read cost hour gpuhour lost impact
slowdown time start end long duration when evidence cause reason check clear cleared rule ruled
family category confidence recommendation fix next batch input data loader kernel hang stall
stuck memory utilization util power temperature training train run model queue request token
vllm inference serving cluster machine host server process worker sequence imbalance divergence
nan learning degrading retry rerun restart crash fail failure healthy problem issue wrong
affected blame responsible
"""
DOMAIN = frozenset(_DOMAIN_TEXT.split())
_WORD = re.compile(r"[a-z][a-z0-9_]*")
_CITE = re.compile(r"\[[^\]]*\]")


def _stem(word: str) -> str:
    """A crude stem, enough to match "ranks"/"rank", "throttled"/"throttle", "nodes'"."""
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def _words(text: str) -> list[str]:
    low = text.lower().replace("'s", " ").replace("-", "")
    return [w for w in _WORD.findall(low) if w not in _STOPWORDS and len(w) > 1]


def scope_words(verdict: dict[str, Any], steps: list[ToolResult]) -> set[str]:
    """Stems of every word the evidence, the verdict's text and the checks use, and the
    domain's."""
    texts: list[str] = [
        str(verdict.get(k) or "") for k in ("title", "summary", "recommendation", "explanation")
    ]
    texts += [str(verdict.get("family") or "").replace("_", " ")]
    for e in verdict.get("evidence") or []:
        texts += [str(e.get("signal") or "").replace("_", " "), str(e.get("note") or "")]
    for c in verdict.get("cleared") or []:
        texts += [str(c.get("check") or ""), str(c.get("note") or "")]
    for s in steps:
        texts += [s.check, s.returned, s.concluded]
    words = {_stem(w) for t in texts for w in _words(t)}
    return words | {_stem(w) for w in DOMAIN}


def out_of_scope(question: str, scope: set[str]) -> list[str]:
    """The question's content words the evidence does not cover, when they outweigh those it
    does (then the question is refused before any model runs); [] when it is in scope."""
    content = list(dict.fromkeys(_words(question)))
    # A number, a GPU or an evidence id in the question is the evidence's vocabulary.
    unknown = [w for w in content if _stem(w) not in scope and not any(c.isdigit() for c in w)]
    known = len(content) - len(unknown)
    if known == 0 or len(unknown) > known:
        return unknown or content or [question.strip()[:40]]
    return []


def _said(words: list[str]) -> str:
    named = [f"'{w}'" for w in words[:4]]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " or " + named[-1]


def question_error(question: str) -> str | None:
    """Why a question cannot be asked at all (empty, too long), or None."""
    text = question.strip()
    if not text:
        return "may not be blank"
    if len(text) > MAX_QUESTION_CHARS:
        return f"at most {MAX_QUESTION_CHARS} characters, got {len(text)}"
    return None


@dataclass
class Answer:
    question: str
    model: str
    steps: list[ToolResult]
    text: str = ""  # what is published: the validated answer, or the refusal
    cited: list[str] = field(default_factory=list)
    validated: bool = False
    refused: bool = False
    reason: str = ""  # why refused: "out of scope", "the model: …", a complaint, an error
    attempts: list[Attempt] = field(default_factory=list)
    duration_s: float = 0.0
    error: str | None = None

    @property
    def tokens(self) -> dict[str, int]:
        return {
            "prompt": sum(a.prompt_tokens for a in self.attempts),
            "completion": sum(a.completion_tokens for a in self.attempts),
        }

    def as_dict(self) -> dict[str, Any]:
        """How it was answered (stored beside the answer): the model, its attempts and the
        validator's complaints, the tokens, the checks it read."""
        return {
            "model": self.model,
            "attempts": len(self.attempts),
            "complaints": [a.complaints for a in self.attempts if a.complaints],
            "tokens": self.tokens,
            "steps": [s.as_step() for s in self.steps],
            **({"error": self.error} if self.error else {}),
        }


def answer_schema(ids: list[str]) -> dict[str, Any]:
    """The answer's JSON: whether the facts answer it, the answer, its citations (ids that
    exist: with llama.cpp's grammar a citation of an id that does not exist cannot be
    written)."""
    return {
        "type": "object",
        "properties": {
            "answerable": {"type": "boolean"},
            "answer": {
                "type": "string",
                "minLength": MIN_ANSWER_CHARS,
                "maxLength": MAX_ANSWER_CHARS,
            },
            "cited": {"type": "array", "items": {"enum": ids}, "minItems": 1, "maxItems": 3},
        },
        "required": ["answerable", "answer", "cited"],
    }


def prompt(
    question: str, verdict: dict[str, Any], steps: list[ToolResult], complaint: str = ""
) -> list[dict[str, str]]:
    lines = [*fact_lines(verdict, steps), f"QUESTION: {question.strip()}"]
    if complaint:
        lines.append(
            f"A previous answer was rejected: {complaint}. Use only the facts above, copied "
            "exactly."
        )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(lines)}]


def _parse(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text, strict=False)  # a raw newline in a string: run._parse
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("answer"), str):
        value["answer"] = " ".join(value["answer"].split())
    return value


def publishable(answer: dict[str, Any]) -> tuple[str, list[str]]:
    """The published text of a valid answer (its ids appended where it has none inline), and
    the ids it cites."""
    text = str(answer.get("answer") or "").strip()
    cited = [str(c) for c in answer.get("cited") or []]
    inline = [c.strip() for g in _CITE.findall(text) for c in g.strip("[]").split(",")]
    if cited and not inline:
        text = f"{text.rstrip('.')} [{', '.join(cited)}]."
    return text, list(dict.fromkeys(inline + cited))


def check_answer(
    answer: dict[str, Any], verdict: dict[str, Any], facts: validate.Facts, question: str = ""
) -> list[str]:
    """Every complaint about an answer the model says the facts support (empty: valid). With
    `question`, the answer must also use one of its content words: a true, cited sentence about
    something else is no answer (measured: "100% of 10-sample blocks [e1, e2, e3]." to "Which
    rank is slow, and since when?" from the 270M model)."""
    text = str(answer.get("answer") or "").strip()
    complaints: list[str] = []
    if len(text) < MIN_ANSWER_CHARS:
        complaints.append("the answer is empty or too short")
    asked = {_stem(w) for w in _words(question)}
    if asked and not asked & {_stem(w) for w in _words(_CITE.sub(" ", text))}:
        words = ", ".join(sorted(asked)[:5])
        complaints.append(f"the answer does not address the question (it names none of: {words})")
    complaints += validate.check_prose(text, str(verdict.get("family")), facts, "the answer")
    published, cited = publishable(answer)
    if not any(c in facts.ids for c in cited):
        complaints.append("the answer cites no evidence id")
    for c in cited:
        if c not in facts.ids and f"cites {c}, which does not exist" not in complaints:
            complaints.append(f"cites {c}, which does not exist")
    if not complaints:
        complaints += validate.check_text(published, facts)
    return list(dict.fromkeys(complaints))


def ask(
    question: str,
    verdict: dict[str, Any],
    window: JobWindow | None,
    writer: Writer | None,
    *,
    retries: int = 1,
) -> Answer:
    """Answer `question` about the verdict from the procedure's checks over `window`; see the
    module doc. `writer` None: no model is available (only an out-of-scope question is then
    answered, by its refusal)."""
    t0 = time.perf_counter()
    steps = run_procedure(verdict, window)
    out = Answer(question=question.strip(), model=writer.name if writer else "", steps=steps)
    unknown = out_of_scope(question, scope_words(verdict, steps))
    if unknown:
        out.refused = True
        out.reason = "out of scope"
        out.text = (
            f"The evidence does not say anything about {_said(unknown)}: it holds this "
            "incident's verdict and the job, node, fabric and storage checks only."
        )
        out.duration_s = time.perf_counter() - t0
        return out
    if writer is None:
        out.refused = True
        out.reason = "no model"
        out.error = "no model is available"
        out.text = "The question could not be answered: no model is available."
        out.duration_s = time.perf_counter() - t0
        return out
    ranks = [r.rank for r in window.ranks] if window is not None else []
    facts = validate.collect_facts(verdict, steps, ranks)
    ids = sorted(facts.ids, key=lambda i: (i[0], int(i[1:])))
    schema = answer_schema(ids)
    complaint = ""
    for attempt in range(1 + retries):
        a0 = time.perf_counter()
        try:
            reply = writer.write(
                prompt(question, verdict, steps, complaint),
                schema,
                MAX_TOKENS,
                RETRY_TEMPERATURE if attempt else 0.0,
            )
        except Exception as exc:  # a model that cannot answer must not lose the question
            out.error = f"{type(exc).__name__}: {exc}"[:300]
            break
        answer = _parse(reply.text)
        if answer is None:
            complaints = ["the answer is not a JSON object"]
        elif answer.get("answerable") is False:
            complaints = []
        else:
            complaints = check_answer(answer, verdict, facts, question)
        out.attempts.append(
            Attempt(
                answer,
                complaints,
                reply.prompt_tokens,
                reply.completion_tokens,
                time.perf_counter() - a0,
            )
        )
        if answer is not None and not complaints:
            if answer.get("answerable") is False:
                out.refused = True
                out.reason = "the model found no fact that answers it"
                out.text = (
                    "The evidence does not say: none of this incident's evidence or checks "
                    "answers the question."
                )
            else:
                out.text, out.cited = publishable(answer)
                out.validated = True
            break
        complaint = "; ".join(complaints[:6])
    if not out.validated and not out.refused:
        out.refused = True
        if out.error:
            out.reason = out.error
            out.text = "The question could not be answered: the model failed."
        else:
            last = out.attempts[-1].complaints[0] if out.attempts else "no answer"
            out.reason = "; ".join(out.attempts[-1].complaints[:6]) if out.attempts else last
            out.text = (
                "The evidence does not back an answer: the model's answer failed the evidence "
                f"check {len(out.attempts)} times (last: {last})."
            )
    out.duration_s = time.perf_counter() - t0
    return out
