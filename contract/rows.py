"""The rows every reader of stored signals hands on: a series (its identity and its samples),
a log line, an event, a process, a job's metadata.

One definition for the trace reader (engine.store.TraceStore), ingest's selectors and the
live store over them (investigations.live), so a row read offline from a trace and live from
the database is the same type (docs/design.md §3 for the identity keys they carry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np


def labels_key(labels: dict[str, str] | None) -> tuple[tuple[str, str], ...]:
    """A labels dict as SeriesInfo keeps it: sorted (key, value) pairs of strings."""
    return tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))


class SeriesInfo(NamedTuple):
    """A series' identity keys (docs/design.md §3) and labels: the key ingest stores a series
    under and the identity every reader hands on with its samples.

    A tuple because ingest hashes it per series of every batch (its stored series hash is
    over these fields in this order: append new fields at the end, never reorder)."""

    name: str
    node: str
    gpu: str
    gpu_index: int | None
    pid: int | None
    job: str
    rank: int | None
    local_rank: int | None = None
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs: hashable

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None


@dataclass(frozen=True)
class SeriesData:
    info: SeriesInfo
    ts: np.ndarray  # float64 seconds, increasing
    values: np.ndarray  # float64


@dataclass(frozen=True)
class LogRow:
    ts: float
    node: str
    pid: int | None
    rank: int | None
    stream: str
    line: str
    step: int | None = None  # the training step ingest parsed from the line, where it did


@dataclass(frozen=True)
class EventRow:
    ts: float
    name: str
    node: str
    gpu: str
    gpu_index: int | None
    job: str
    value: float | None
    text: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class ProcessInfo:
    node: str
    pid: int
    job: str
    rank: int | None
    local_rank: int | None
    gpu: str
    gpu_index: int | None
    cmd: str
    first_ts: float
    exit_code: int | None = None
    exit_ts: float | None = None
    world_size: int | None = None


@dataclass
class JobMeta:
    job: str
    kind: str = "training"
    kind_recorded: bool = False  # a job record said the kind (else `kind` is the default)
    name: str = ""
    nodes: list[str] = field(default_factory=list)
    world_size: int | None = None
    state: str = "running"
    exit_code: int | None = None
    rerun_of: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    first_ts: float = float("inf")
    last_ts: float = float("-inf")
    end_ts: float | None = None  # when a terminal state was recorded
