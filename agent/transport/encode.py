"""Encode trace-v1 records (typed records or their dicts) into wire Batches.

Strings (names, identity values, label keys and values) go into one dictionary per batch and
are referenced by index; the samples of each series are packed into the batch's columnar
`ts_ms`/`values` arrays. A non-finite reading is dropped here and counted (`dropped`) — the
server would refuse the whole batch over it.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from agent import signals
from agent.wire import ingest_pb2

# Scheduler attributes that operators' customer-mapping rules match on.
JOB_ATTRIBUTES = ("slurm_account", "slurm_partition", "slurm_user", "k8s_namespace")
_INT_IDENTITY = (signals.GPU_INDEX, signals.PID, signals.RANK, signals.LOCAL_RANK)


def _as_dict(record: Any) -> Mapping[str, Any]:
    return record if isinstance(record, Mapping) else record.to_dict()


class BatchBuilder:
    """Accumulates records; `build(sequence)` returns the Batch and starts a new one."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.dropped = 0  # non-finite sample values dropped, over the builder's life
        self._reset()

    def _reset(self) -> None:
        self._strings: dict[str, int] = {"": 0}
        self._series: dict[tuple[Any, ...], int] = {}
        self._defs: list[Any] = []
        self._ts: list[list[float]] = []
        self._values: list[list[float]] = []
        self._arrays: list[tuple[int, np.ndarray, np.ndarray]] = []
        self._batch = ingest_pb2.Batch(agent_id=self.agent_id)
        self.samples = 0
        self.records = 0

    def __len__(self) -> int:
        return self.samples + self.records

    def _s(self, value: Any) -> int:
        if value is None or value == "":
            return 0
        text = str(value)
        index = self._strings.get(text)
        if index is None:
            index = self._strings[text] = len(self._strings)
        return index

    def _identity(self, ident: Any, rec: Mapping[str, Any], with_step: bool = True) -> None:
        ident.node = self._s(rec.get(signals.NODE))
        ident.gpu = self._s(rec.get(signals.GPU))
        ident.job = self._s(rec.get(signals.JOB))
        for key in _INT_IDENTITY:
            value = rec.get(key)
            if value is not None:
                setattr(ident, key, int(value))
        if with_step and rec.get(signals.STEP) is not None:
            ident.step = int(rec[signals.STEP])

    def _labels(self, labels: Mapping[str, Any] | None) -> list[int]:
        out: list[int] = []
        for key in sorted(labels or ()):
            out += [self._s(key), self._s(labels[key])]  # type: ignore[index]
        return out

    def _series_index(self, name: str, rec: Mapping[str, Any]) -> int:
        labels = rec.get("labels") or {}
        key = (
            name,
            rec.get(signals.NODE),
            rec.get(signals.GPU),
            rec.get(signals.GPU_INDEX),
            rec.get(signals.PID),
            rec.get(signals.JOB),
            rec.get(signals.RANK),
            rec.get(signals.LOCAL_RANK),
            tuple(sorted(labels.items())),
        )
        index = self._series.get(key)
        if index is None:
            sd = ingest_pb2.SeriesDef(name=self._s(name), labels=self._labels(labels))
            # `step` is not part of a series' identity: it changes every iteration.
            self._identity(sd.identity, rec, with_step=False)
            index = self._series[key] = len(self._defs)
            self._defs.append(sd)
            self._ts.append([])
            self._values.append([])
        return index

    def add_samples(
        self, name: str, identity: Mapping[str, Any], ts: np.ndarray, values: np.ndarray
    ) -> None:
        """Fast path: many samples of one series at once (ts in seconds)."""
        values = np.asarray(values, dtype=np.float64)
        ts = np.asarray(ts, dtype=np.float64)
        finite = np.isfinite(values)
        if not finite.all():
            self.dropped += int((~finite).sum())
            values, ts = values[finite], ts[finite]
        index = self._series_index(name, identity)
        self._arrays.append((index, np.rint(ts * 1000).astype(np.int64), values))
        self.samples += len(values)

    def add(self, record: Any) -> None:
        rec = _as_dict(record)
        rtype = rec.get("type")
        if rtype == "sample":
            value = float(rec["value"])
            if not math.isfinite(value):
                self.dropped += 1
                return
            index = self._series_index(rec["name"], rec)
            self._ts[index].append(rec["ts"])
            self._values[index].append(value)
            self.samples += 1
            return
        ts_us = round(float(rec["ts"]) * 1e6)
        batch = self._batch
        if rtype == "log":
            msg = batch.logs.add(ts_us=ts_us, line=str(rec["line"]))
            msg.stream = self._s(rec.get("stream"))
            self._identity(msg.identity, rec)
        elif rtype == "event":
            msg = batch.events.add(ts_us=ts_us, name=self._s(rec["name"]))
            event_value = rec.get("value")
            if event_value is not None and math.isfinite(float(event_value)):
                msg.value = float(event_value)
            msg.text = str(rec.get("text") or "")
            msg.labels.extend(self._labels(rec.get("labels")))
            self._identity(msg.identity, rec)
        elif rtype == "process":
            msg = batch.processes.add(ts_us=ts_us)
            self._identity(msg.identity, rec)
            if rec.get("world_size") is not None:
                msg.world_size = int(rec["world_size"])
            cmd = rec.get("cmd")
            msg.cmd = shlex.join(cmd) if isinstance(cmd, list) else str(cmd or "")
        elif rtype == "exit":
            msg = batch.exits.add(ts_us=ts_us, exit_code=int(rec["exit_code"]))
            self._identity(msg.identity, rec)
        elif rtype == "job":
            self._add_job(ts_us, rec)
        else:
            return  # unknown record types are ignored, never an error (DESIGN §5)
        self.records += 1

    def _add_job(self, ts_us: int, rec: Mapping[str, Any]) -> None:
        msg = self._batch.jobs.add(ts_us=ts_us, job=self._s(rec["job"]))
        for key in ("kind", "name", "scheduler", "state", "rerun_of"):
            if rec.get(key):
                setattr(msg, key, str(rec[key]))
        nodes = rec.get("nodes")
        if isinstance(nodes, list):
            msg.nodes.extend(self._s(n) for n in nodes)
        elif nodes is not None:
            msg.attributes["nodes"] = str(nodes)
        for key in ("world_size", "exit_code"):
            if rec.get(key) is not None:
                setattr(msg, key, int(rec[key]))
        if rec.get("config") is not None:
            msg.config_json = json.dumps(rec["config"], sort_keys=True)
        for key in JOB_ATTRIBUTES:
            if rec.get(key) is not None:
                msg.attributes[key] = str(rec[key])

    def extend(self, records: Iterable[Any]) -> None:
        for record in records:
            self.add(record)

    def build(self, sequence: int) -> Any:
        """The accumulated records as Batch `sequence`; the builder starts empty again."""
        batch = self._batch
        batch.sequence = sequence
        ts_parts: list[list[np.ndarray]] = [
            [np.rint(np.asarray(t, dtype=np.float64) * 1000).astype(np.int64)] for t in self._ts
        ]
        value_parts = [[np.asarray(v, dtype=np.float64)] for v in self._values]
        for index, ts_ms, values in self._arrays:
            ts_parts[index].append(ts_ms)
            value_parts[index].append(values)
        counts = [sum(len(p) for p in parts) for parts in value_parts]
        keep = [i for i, c in enumerate(counts) if c]
        if keep:
            ts_all = np.concatenate([p for i in keep for p in ts_parts[i]])
            values_all = np.concatenate([p for i in keep for p in value_parts[i]])
            batch.series.extend(self._defs[i] for i in keep)
            batch.sample_counts.extend(counts[i] for i in keep)
            batch.ts_ms.extend(np.diff(ts_all, prepend=np.int64(0)).tolist())
            batch.values.extend(values_all.tolist())
        batch.strings.extend(sorted(self._strings, key=self._strings.__getitem__))
        self._reset()
        return batch
