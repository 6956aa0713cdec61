"""Trace records (docs/design.md §5): typed, compact record classes and per-line validation rules.

Records are slotted dataclasses because they are the agent's hot path (one per reading, ~850 a
second per node); every field past the type's required keys defaults to None and is omitted
from the JSON. Keys a record does not know are kept in `extra` and written back unchanged, so a
trace passes through the agent without losing anything.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from typing import Any, ClassVar

from contract import limits, signals

FORMAT = "proof-trace"
VERSION = 1

TYPE_META = "meta"
TYPE_SAMPLE = "sample"
TYPE_EVENT = "event"
TYPE_LOG = "log"
TYPE_PROCESS = "process"
TYPE_EXIT = "exit"
TYPE_JOB = "job"

# Identity keys and their JSON types (docs/design.md §3). `job` is a string even for numeric
# Slurm ids.
IDENTITY_TYPES: dict[str, type] = {
    signals.NODE: str,
    signals.GPU: str,
    signals.GPU_INDEX: int,
    signals.PID: int,
    signals.JOB: str,
    signals.RANK: int,
    signals.LOCAL_RANK: int,
    signals.STEP: int,
}

# Kinds, worded to read after "must be".
_NUM = "a finite number"
_INT = "an integer"
_STR = "a string"
_OBJ = "an object"
_STR_OR_LIST = "a string or a list of strings"

# type -> ((required key, kind), ...) beyond `type` itself (docs/design.md §5 table).
REQUIRED_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    TYPE_SAMPLE: (("ts", _NUM), ("name", _STR), ("value", _NUM)),
    TYPE_EVENT: (("ts", _NUM), ("name", _STR)),
    TYPE_LOG: (("ts", _NUM), ("line", _STR)),
    TYPE_PROCESS: (("ts", _NUM), ("node", _STR), ("pid", _INT)),
    TYPE_EXIT: (("ts", _NUM), ("node", _STR), ("pid", _INT), ("exit_code", _INT)),
    TYPE_JOB: (("ts", _NUM), ("job", _STR)),
}
# The record types a trace's body holds (every type but the `meta` header): those with a row in
# the §5 table above.
RECORD_TYPES: tuple[str, ...] = tuple(REQUIRED_KEYS)
# Optional keys whose type is checked when present (unknown keys are never checked).
OPTIONAL_KEYS: dict[str, dict[str, str]] = {
    TYPE_SAMPLE: {},
    TYPE_EVENT: {"value": _NUM, "text": _STR},
    TYPE_LOG: {"stream": _STR},
    TYPE_PROCESS: {"world_size": _INT, "cmd": _STR_OR_LIST},
    TYPE_EXIT: {},
    TYPE_JOB: {
        "kind": _STR,
        "name": _STR,
        "world_size": _INT,
        "scheduler": _STR,
        "state": _STR,
        "exit_code": _INT,
        "config": _OBJ,
        "rerun_of": _STR,
    },
}
_IDENTITY_KINDS = {k: (_STR if t is str else _INT) for k, t in IDENTITY_TYPES.items()}


_KIND_TYPES: dict[str, frozenset[type]] = {
    _NUM: frozenset((int, float)),
    _INT: frozenset((int,)),
    _STR: frozenset((str,)),
    _OBJ: frozenset((dict,)),
    _STR_OR_LIST: frozenset((str, list)),
}


def _describe(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"non-finite {value!r}"
    if value is None:
        return "null"
    return f"{type(value).__name__} {value!r}"[:80]


_LABELS = "labels"
# type -> key -> (allowed types, kind, what to call it in a message): every key a record of that
# type has whose value is checked, so one pass over the record's own keys checks it.
_CHECKS: dict[str, dict[str, tuple[frozenset[type], str, str]]] = {}
for _rtype, _required in REQUIRED_KEYS.items():
    _table: dict[str, tuple[frozenset[type], str, str]] = {}
    for _key, _kind in _IDENTITY_KINDS.items():
        _table[_key] = (_KIND_TYPES[_kind], _kind, f"identity key {_key!r}")
    for _key, _kind in (*OPTIONAL_KEYS[_rtype].items(), *_required):
        _table[_key] = (_KIND_TYPES[_kind], _kind, f"{_rtype} record: {_key!r}")
    _CHECKS[_rtype] = _table


def check_record(obj: Any) -> str | None:
    """Why a decoded trace line is not a valid v1 record, or None when it is.

    Unknown record types pass (they are kept or ignored, never an error); meta records are
    checked by `check_meta`. Optional and identity keys that are null count as absent.
    """
    if type(obj) is not dict:
        return f"a record must be a JSON object, got {type(obj).__name__}"
    rtype = obj.get("type")
    if type(rtype) is not str:
        return "missing or non-string 'type'" if rtype is None else f"'type' is {_describe(rtype)}"
    checks = _CHECKS.get(rtype)
    if checks is None:
        if rtype == TYPE_META:
            return check_meta(obj)
        return None
    for key, kind in REQUIRED_KEYS[rtype]:
        value = obj.get(key)
        if value is None:
            if key not in obj:
                return f"{rtype} record is missing required key {key!r}"
            return f"{rtype} record: {key!r} must be {kind}, got null"
    for key, value in obj.items():
        check = checks.get(key)
        if check is None:
            if key == _LABELS and value is not None:
                if type(value) is not dict:
                    return f"'labels' must be an object of strings, got {_describe(value)}"
                for lk, lv in value.items():
                    if type(lv) is not str:
                        return f"labels[{lk!r}] must be a string, got {_describe(lv)}"
            continue
        if value is None:
            continue
        t = type(value)
        if t not in check[0] or (t is float and not math.isfinite(value)):
            return f"{check[2]} must be {check[1]}, got {_describe(value)}"
        if t is list and not all(type(x) is str for x in value):
            return f"{check[2]} must be {check[1]}, got {_describe(value)}"
    return None


def check_meta(obj: Any) -> str | None:
    """Why a decoded first line is not a valid v1 meta record, or None."""
    if type(obj) is not dict or obj.get("type") != TYPE_META:
        return "the first line must be the meta record {'type': 'meta', ...}"
    if obj.get("format") != FORMAT:
        return f"meta 'format' must be {FORMAT!r}, got {obj.get('format')!r}"
    version = obj.get("version")
    if version != VERSION or type(version) is not int:
        return f"unsupported trace version {version!r} (this reader reads version {VERSION})"
    return None


def read_meta_line(obj: Any) -> tuple[dict[str, Any] | None, str | None, bool]:
    """What the decoded first line of a trace is, as (meta, problem, a record too): a valid
    meta line is (it, None, False); a meta line that is not valid (None, why, False); any other
    line (None, why, True) — it is still read as a record, the meta missing."""
    problem = check_meta(obj)
    if problem is None:
        return obj, None, False
    return None, problem, not (type(obj) is dict and obj.get("type") == TYPE_META)


# --- Typed records ------------------------------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class _Base:
    """Fields every record may carry: timestamp, identity keys, labels, unknown keys."""

    TYPE: ClassVar[str] = ""
    # Field names written before identity, in this order (after "type" and "ts").
    BODY: ClassVar[tuple[str, ...]] = ()

    ts: float
    node: str | None = None
    gpu: str | None = None
    gpu_index: int | None = None
    pid: int | None = None
    job: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    step: int | None = None
    labels: dict[str, str] | None = None
    extra: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as its trace JSON object: None fields omitted, unknown keys kept."""
        out: dict[str, Any] = {"type": self.TYPE, "ts": self.ts}
        for key in self.BODY:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        for key in _IDENTITY_ORDER:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.labels:
            out["labels"] = self.labels
        if self.extra:
            for key, value in self.extra.items():
                out.setdefault(key, value)
        return out


_IDENTITY_ORDER: tuple[str, ...] = signals.IDENTITY_KEYS


@dataclass(slots=True, kw_only=True)
class Sample(_Base):
    TYPE: ClassVar[str] = TYPE_SAMPLE
    BODY: ClassVar[tuple[str, ...]] = ("name", "value")
    name: str
    value: float


@dataclass(slots=True, kw_only=True)
class Event(_Base):
    TYPE: ClassVar[str] = TYPE_EVENT
    BODY: ClassVar[tuple[str, ...]] = ("name", "value", "text")
    name: str
    value: float | None = None
    text: str | None = None


@dataclass(slots=True, kw_only=True)
class Log(_Base):
    TYPE: ClassVar[str] = TYPE_LOG
    BODY: ClassVar[tuple[str, ...]] = ("line", "stream")
    line: str
    stream: str | None = None


@dataclass(slots=True, kw_only=True)
class Process(_Base):
    TYPE: ClassVar[str] = TYPE_PROCESS
    BODY: ClassVar[tuple[str, ...]] = ("world_size", "cmd")
    world_size: int | None = None
    cmd: str | list[str] | None = None


@dataclass(slots=True, kw_only=True)
class Exit(_Base):
    TYPE: ClassVar[str] = TYPE_EXIT
    BODY: ClassVar[tuple[str, ...]] = ("exit_code",)
    exit_code: int


@dataclass(slots=True, kw_only=True)
class Job(_Base):
    TYPE: ClassVar[str] = TYPE_JOB
    BODY: ClassVar[tuple[str, ...]] = (
        "kind",
        "name",
        "nodes",
        "world_size",
        "scheduler",
        "state",
        "exit_code",
        "config",
        "rerun_of",
    )
    kind: str | None = None
    name: str | None = None
    nodes: Any = None  # a count or a list of hostnames: schedulers report either
    world_size: int | None = None
    scheduler: str | None = None
    state: str | None = None
    exit_code: int | None = None
    config: dict[str, Any] | None = None
    rerun_of: str | None = None


Record = Sample | Event | Log | Process | Exit | Job

RECORD_CLASSES: dict[str, type[_Base]] = {
    cls.TYPE: cls for cls in (Sample, Event, Log, Process, Exit, Job)
}
_KNOWN_FIELDS: dict[str, frozenset[str]] = {
    t: frozenset(("type", "ts", "labels", *_IDENTITY_ORDER, *cls.BODY))
    for t, cls in RECORD_CLASSES.items()
}


def from_dict(obj: dict[str, Any]) -> Record | None:
    """The typed record of a valid trace object (see `check_record`); None for unknown types."""
    rtype = obj.get("type")
    cls = RECORD_CLASSES.get(rtype)  # type: ignore[arg-type]
    if cls is None:
        return None
    known = _KNOWN_FIELDS[rtype]  # type: ignore[index]
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] | None = None
    for key, value in obj.items():
        if key in known:
            if key != "type":
                kwargs[key] = value
        else:
            if extra is None:
                extra = {}
            extra[key] = value
    if extra is not None:
        kwargs["extra"] = extra
    return cls(**kwargs)  # type: ignore[return-value]


# --- Limits (contract/limits.py): what the reader reports and cleans ----------------------------

_ID_LIMITS: tuple[tuple[str, int], ...] = (
    (signals.NODE, limits.MAX_NODE_CHARS),
    (signals.GPU, limits.MAX_GPU_CHARS),
    (signals.JOB, limits.MAX_JOB_CHARS),
)
# type -> ((key, limit, how it is cleaned), ...): "id" identifiers, "text" free text,
# "line" output lines.
_FIELD_LIMITS: dict[str, tuple[tuple[str, int, str], ...]] = {
    TYPE_SAMPLE: (("name", limits.MAX_SIGNAL_NAME_CHARS, "id"),),
    TYPE_EVENT: (
        ("name", limits.MAX_EVENT_NAME_CHARS, "id"),
        ("text", limits.MAX_EVENT_TEXT_CHARS, "text"),
    ),
    TYPE_LOG: (
        ("line", limits.MAX_LOG_LINE_CHARS, "line"),
        ("stream", limits.MAX_STREAM_CHARS, "id"),
    ),
    TYPE_PROCESS: (("cmd", limits.MAX_CMD_CHARS, "text"),),
    TYPE_EXIT: (),
    TYPE_JOB: (
        *((k, lim, "id" if k == "rerun_of" else "text") for k, lim in limits.JOB_TEXT_LIMITS),
        # Scheduler attributes (contract.wire.encode.JOB_ATTRIBUTES) travel as job attributes.
        ("slurm_account", limits.MAX_ATTRIBUTE_VALUE_CHARS, "id"),
        ("slurm_partition", limits.MAX_ATTRIBUTE_VALUE_CHARS, "id"),
        ("slurm_user", limits.MAX_ATTRIBUTE_VALUE_CHARS, "id"),
        ("k8s_namespace", limits.MAX_ATTRIBUTE_VALUE_CHARS, "id"),
    ),
}
_CLEANERS = {
    "id": limits.clean_identifier,
    "text": limits.clean_text,
    "line": limits.clean_line,
}


def _over(value: Any, limit: int) -> bool:
    return type(value) is str and (len(value) > limit or "\x00" in value)


def clean_record(obj: dict[str, Any]) -> list[str]:
    """Clean a valid record (`check_record` passed) to the limits of contract/limits.py, in place;
    returns one message per field that broke one (empty for a clean record: the usual case,
    a few C-level string scans). The same limits the agent cleans to and ingest checks."""
    rtype = obj.get("type")
    fields = _FIELD_LIMITS.get(rtype)  # type: ignore[arg-type]
    if fields is None:
        return []
    found: list[str] = []
    for key, limit in _ID_LIMITS:
        value = obj.get(key)
        if _over(value, limit):
            found.append(_fix(obj, key, limit, "id", f"identity key {key!r}"))
    for key, limit, how in fields:
        value = obj.get(key)
        if _over(value, limit):
            found.append(_fix(obj, key, limit, how, f"{rtype} record: {key!r}"))
        elif type(value) is list and key == "cmd":
            found.extend(_fix_cmd(obj, value))
    labels = obj.get(_LABELS)
    if type(labels) is dict and labels:
        problem = limits.labels_problem(labels)
        if problem is not None:
            obj[_LABELS] = limits.clean_labels(labels)
            found.append(f"'labels': {problem[1]} (cleaned)")
    if rtype == TYPE_JOB:
        found.extend(_fix_job(obj))
    return found


def _fix(obj: dict[str, Any], key: str, limit: int, how: str, what: str) -> str:
    value = obj[key]
    problem = limits.text_problem(value, limit)
    obj[key] = _CLEANERS[how](value, limit)
    detail = problem[1] if problem is not None else "cleaned"
    return f"{what}: {detail} (cleaned to {len(obj[key])} characters)"


def _fix_cmd(obj: dict[str, Any], cmd: list[Any]) -> list[str]:
    if not any(type(a) is str and "\x00" in a for a in cmd) and (
        sum(len(a) + 1 for a in cmd if type(a) is str) <= limits.MAX_CMD_CHARS
    ):
        return []
    joined = shlex.join(limits.clean_chars(str(a)) for a in cmd)
    obj["cmd"] = limits.clean_text(joined, limits.MAX_CMD_CHARS)
    return [f"process record: 'cmd' breaks the limits (cleaned to {len(obj['cmd'])} characters)"]


def _fix_job(obj: dict[str, Any]) -> list[str]:
    found: list[str] = []
    nodes = obj.get("nodes")
    if type(nodes) is list and (
        len(nodes) > limits.MAX_JOB_NODES or any(_over(n, limits.MAX_NODE_CHARS) for n in nodes)
    ):
        obj["nodes"] = [
            limits.clean_identifier(n, limits.MAX_NODE_CHARS) if type(n) is str else n
            for n in nodes[: limits.MAX_JOB_NODES]
        ]
        found.append(f"job record: 'nodes' breaks the limits ({len(nodes)} nodes; cleaned)")
    config = obj.get("config")
    if type(config) is dict and config:
        text = limits.config_json(config)
        raw = json.dumps(config, sort_keys=True, default=str)
        if text != raw:
            obj["config"] = json.loads(text)
            problem = limits.config_problem(raw)
            detail = problem[1] if problem is not None else "holds characters that cannot be stored"
            found.append(f"job record: 'config': {detail} (cleaned)")
    return found
