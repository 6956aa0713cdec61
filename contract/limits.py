"""The limits every record meets, defined once for the agent and ingest (part of the contract,
with contract/signals.py and contract/trace): the agent cleans what it collects to them, ingest
refuses a record that breaks one (that record alone, never the batch around it), and the
trace reader reports and cleans a line that breaks one. Standard library only: the agent and a
future contract package import it without Django or numpy.

The identifier sizes are ingest's database columns (ingest/models.py): a value over them is one
PostgreSQL would refuse (`value too long for type character varying(96)`), and so is any NUL
character in a text or JSON column.

Cleaning (what the agent does, `clean_*`):
- NUL characters and invalid UTF-8 become U+FFFD (bytes are decoded with `errors="replace"`
  at the readers; `decode_output()` does both at once); a lone surrogate (a file name decoded
  with `surrogateescape`) too.
- A log line over MAX_LOG_LINE_CHARS that holds carriage returns is a progress bar redrawn with
  `\\r`: only what follows the last `\\r` is kept, exactly what a terminal shows. If it is still
  over, its start is kept and the end replaced by the marker `…[truncated N chars]` (N = the
  characters removed), so the result is exactly at the limit, never over.
- Free text (event text, command lines, job names) is truncated the same way.
- An identifier (node, GPU id, job id, signal and event names, label and attribute keys and
  values) over its limit keeps its start and ends in `…#` + 8 hex digits of a hash of the whole
  value, so two long ids that share a prefix stay two ids.
- Labels beyond MAX_LABELS are dropped (sorted by key; the last kept slot becomes
  `labels_dropped` = how many); job attributes likewise beyond MAX_JOB_ATTRIBUTES.
- A job config whose JSON is over MAX_CONFIG_JSON_CHARS is replaced by
  `{"proof_truncated": "config of N characters, over the limit of M"}`.

Checking (what ingest and the trace reader do, `*_problem`): the same limits, as
`(reason, message)`; `reason` is the short label of ingest's reject metric.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

# --- free text ----------------------------------------------------------------------------------
MAX_LOG_LINE_CHARS = 16 * 1024  # LogLine.line (text)
MAX_EVENT_TEXT_CHARS = 16 * 1024  # Event.text (text): an XID's kernel line, an error message
MAX_CMD_CHARS = 16 * 1024  # Process.cmd (text)
MAX_CONFIG_JSON_CHARS = 64 * 1024  # Job.config (jsonb), as JSON text
# --- identifiers (ingest/models.py column sizes) ------------------------------------------------
MAX_NODE_CHARS = 255  # Node.hostname
MAX_GPU_CHARS = 96  # Gpu.uuid, Series.gpu, Event.gpu, Process.gpu, JobRank.gpu
MAX_JOB_CHARS = 255  # Job.job_id, Job.rerun_of
MAX_SIGNAL_NAME_CHARS = 255  # Series.name
MAX_EVENT_NAME_CHARS = 128  # Event.name
MAX_STREAM_CHARS = 16  # LogLine.stream
MAX_AGENT_ID_CHARS = 128  # BatchReceipt.agent_id, Node.agent_id
MAX_JOB_KIND_CHARS = 32  # Job.kind
MAX_JOB_NAME_CHARS = 255  # Job.name
MAX_SCHEDULER_CHARS = 64  # Job.scheduler
# A job record's free-text fields and their limits (agent encoder, trace reader and ingest).
JOB_TEXT_LIMITS: tuple[tuple[str, int], ...] = (
    ("kind", MAX_JOB_KIND_CHARS),
    ("name", MAX_JOB_NAME_CHARS),
    ("scheduler", MAX_SCHEDULER_CHARS),
    ("state", MAX_JOB_KIND_CHARS),
    ("rerun_of", MAX_JOB_CHARS),
)
# --- labels and job attributes (jsonb objects) --------------------------------------------------
MAX_LABELS = 32  # per series or event
MAX_LABEL_KEY_CHARS = 128
MAX_LABEL_VALUE_CHARS = 1024
MAX_JOB_ATTRIBUTES = 32
MAX_ATTRIBUTE_KEY_CHARS = 64
MAX_ATTRIBUTE_VALUE_CHARS = 1024
MAX_JOB_NODES = 4096  # hostnames in one job record

# Reasons (the `reason` label of proof_ingest_record_rejects_total).
NUL = "nul"
TOO_LONG = "too_long"
TOO_MANY = "too_many"
BAD_TEXT = "bad_text"  # a lone surrogate: not encodable as UTF-8

REPLACEMENT = "\ufffd"
LABELS_DROPPED = "labels_dropped"
CONFIG_TRUNCATED = "proof_truncated"
_HASH_SUFFIX_CHARS = 10  # "…#" + 8 hex digits

Problem = tuple[str, str]  # (reason, message)
# A JSON \\uD800-\\uDBFF escape not followed by a low one, or a low one not after a high one.
_LONE_SURROGATE_ESCAPE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
    r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def decode_output(raw: bytes) -> str:
    """Bytes a job wrote → text: invalid UTF-8 and NUL bytes become U+FFFD (the cheap
    byte-level step the readers do; the rest of the cleaning is `clean_line`)."""
    text = raw.decode("utf-8", "replace")
    return text.replace("\x00", REPLACEMENT) if "\x00" in text else text


def _unencodable(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _replace_surrogates(text: str) -> str:
    return "".join(REPLACEMENT if "\ud800" <= c <= "\udfff" else c for c in text)


def is_clean(text: str, limit: int) -> bool:
    """Within `limit` characters, no NUL, no lone surrogate: the usual case, which every
    cleaning function returns untouched (two C-level scans for clean ASCII)."""
    return len(text) <= limit and "\x00" not in text and not _unencodable(text)


def clean_chars(text: str) -> str:
    """NUL characters and lone surrogates replaced by U+FFFD; nothing else changes."""
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    if _unencodable(text):
        text = _replace_surrogates(text)
    return text


def truncate(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, its end replaced by `…[truncated N chars]`."""
    if len(text) <= limit:
        return text
    # The marker's length depends on N's digits, and N on the marker's length: try each width.
    for digits in range(len(str(len(text))), 0, -1):
        keep = max(limit - len("…[truncated  chars]") - digits, 0)
        if len(str(len(text) - keep)) == digits:
            break
    return (text[:keep] + f"…[truncated {len(text) - keep} chars]")[:limit]


def clean_text(text: str, limit: int) -> str:
    """Free text: bad characters replaced, then truncated to `limit` with a marker."""
    if is_clean(text, limit):
        return text
    return truncate(clean_chars(text), limit)


def clean_line(line: str, limit: int = MAX_LOG_LINE_CHARS) -> str:
    """A job's output line: bad characters replaced; over the limit, a `\\r`-redrawn progress
    bar keeps its last redraw, and what is still over is truncated with a marker."""
    if is_clean(line, limit):
        return line
    line = clean_chars(line)
    if len(line) > limit and "\r" in line:
        last = line.rstrip("\r").rsplit("\r", 1)[-1]
        line = last if last else line
    return truncate(line, limit)


def clean_identifier(value: str, limit: int) -> str:
    """An id or name: bad characters replaced; over the limit, its start and a hash of the
    whole value (`…#1a2b3c4d`), so distinct long ids stay distinct."""
    if is_clean(value, limit):
        return value
    value = clean_chars(value)
    if len(value) <= limit:
        return value
    digest = hashlib.blake2b(value.encode("utf-8"), digest_size=4).hexdigest()
    return value[: max(limit - _HASH_SUFFIX_CHARS, 0)] + "…#" + digest


def clean_mapping(
    items: Mapping[Any, Any] | None, max_items: int, key_limit: int, value_limit: int
) -> dict[str, str] | None:
    """Labels or job attributes: string keys and values cleaned as identifiers; beyond
    `max_items` (by sorted key) dropped, the last kept slot saying how many went."""
    if not items:
        return None if items is None else {}
    out: dict[str, str] = {}
    for key in sorted(items, key=str):
        value = items[key]
        out[clean_identifier(str(key), key_limit)] = clean_identifier(
            "" if value is None else str(value), value_limit
        )
    if len(out) > max_items:
        kept = dict(list(out.items())[: max_items - 1])
        kept[LABELS_DROPPED] = str(len(out) - len(kept))
        out = kept
    return out


def clean_labels(labels: Mapping[Any, Any] | None) -> dict[str, str] | None:
    return clean_mapping(labels, MAX_LABELS, MAX_LABEL_KEY_CHARS, MAX_LABEL_VALUE_CHARS)


def clean_attributes(attributes: Mapping[Any, Any] | None) -> dict[str, str] | None:
    return clean_mapping(
        attributes, MAX_JOB_ATTRIBUTES, MAX_ATTRIBUTE_KEY_CHARS, MAX_ATTRIBUTE_VALUE_CHARS
    )


def _clean_json(value: Any) -> Any:
    if isinstance(value, str):
        return clean_chars(value)
    if isinstance(value, dict):
        return {clean_chars(str(k)): _clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean_json(v) for v in value]
    return value


def config_json(config: Mapping[str, Any]) -> str:
    """A job's config as the JSON text the wire carries: NUL and lone surrogates replaced in
    every key and string, and the whole replaced by a marker object when over the limit."""
    try:
        text = json.dumps(config, sort_keys=True, default=str)
        if "\\u0000" in text or "\\ud" in text:
            text = json.dumps(_clean_json(config), sort_keys=True, default=str)
    except (ValueError, TypeError, RecursionError) as exc:  # e.g. nested past the parser
        return json.dumps({CONFIG_TRUNCATED: f"config not encodable: {type(exc).__name__}"})
    if len(text) > MAX_CONFIG_JSON_CHARS:
        text = json.dumps(
            {
                CONFIG_TRUNCATED: f"config of {len(text)} characters, over the limit of "
                f"{MAX_CONFIG_JSON_CHARS}"
            }
        )
    return text


# --- checks ----------------------------------------------------------------------------------


def text_problem(text: str, limit: int) -> Problem | None:
    """Why `text` breaks the limits (over `limit` characters, a NUL, a lone surrogate), or
    None. Cheap: two C-level scans for the usual clean ASCII string."""
    if len(text) > limit:
        return TOO_LONG, f"{len(text)} characters, over the limit of {limit}"
    if "\x00" in text:
        return NUL, f"NUL character at position {text.index(chr(0))}"
    if _unencodable(text):
        return BAD_TEXT, "holds a lone surrogate (not valid UTF-8)"
    return None


def mapping_problem(
    items: Mapping[str, str], max_items: int, key_limit: int, value_limit: int
) -> tuple[str, str] | None:
    if len(items) > max_items:
        return TOO_MANY, f"{len(items)} entries, over the limit of {max_items}"
    for key, value in items.items():
        problem = text_problem(key, key_limit)
        if problem is not None:
            return problem[0], f"key {key[:40]!r}…: {problem[1]}"
        problem = text_problem(value, value_limit)
        if problem is not None:
            return problem[0], f"{key[:40]!r}: {problem[1]}"
    return None


def labels_problem(labels: Mapping[str, str]) -> Problem | None:
    return mapping_problem(labels, MAX_LABELS, MAX_LABEL_KEY_CHARS, MAX_LABEL_VALUE_CHARS)


def attributes_problem(attributes: Mapping[str, str]) -> Problem | None:
    return mapping_problem(
        attributes, MAX_JOB_ATTRIBUTES, MAX_ATTRIBUTE_KEY_CHARS, MAX_ATTRIBUTE_VALUE_CHARS
    )


def config_problem(text: str) -> Problem | None:
    """A job's config_json: over the size limit, or holding a NUL (PostgreSQL's jsonb refuses
    `\\u0000`)."""
    if len(text) > MAX_CONFIG_JSON_CHARS:
        return TOO_LONG, f"{len(text)} characters, over the limit of {MAX_CONFIG_JSON_CHARS}"
    if "\x00" in text or "\\u0000" in text:
        return NUL, "holds a NUL character"
    if ("\\ud" in text or "\\uD" in text) and _LONE_SURROGATE_ESCAPE.search(text):
        return BAD_TEXT, "holds a lone surrogate escape (not valid Unicode)"
    return None
