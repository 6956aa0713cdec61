"""DCGM fields through DCGM's own Python bindings (pydcgm), when they are installed.

NVML cannot see inside the SMs; DCGM's profiling ("DCP") fields can: graphics engine active,
SM active/occupancy, tensor pipes, DRAM, PCIe/NVLink bytes. The bindings ship with DCGM, not
on PyPI, under `/usr/local/dcgm/bindings/python3` (DCGM 3) or
`/usr/share/datacenter-gpu-manager-4/bindings/python3` (DCGM 4); the path is configurable and
the import is lazy, so a node without DCGM costs nothing: `available` is False,
`unavailable_reason` says why (doctor prints it) and `collect()` returns nothing.

Shape of the binding API used (DCGM `testing/python3`): `pydcgm.DcgmHandle(ipAddress=…,
opMode=…)`, `pydcgm.DcgmGroup(handle, groupId=dcgm_structs.DCGM_GROUP_ALL_GPUS)`,
`pydcgm.DcgmFieldGroup(handle, name=…, fieldIds=[…])`, `group.samples.WatchFields(fieldGroup,
updateFreq_us, maxKeepAge_s, maxKeepSamples)`, `group.samples.GetLatest(fieldGroup).values`
→ `{gpuId: {fieldId: series}}` where `series[-1]` has `.value`, `.isBlank`, `.ts` (µs).

What is watched: the fields of contract.dcgm_fields (docs/dcgm-fields.md: dcgm-exporter's
default and DCP sets plus the device fields issue 17 names, per-link NVLink included), less
those the NVML collector already reads (`nvml.NVML_SIGNALS`) unless `fields` says otherwise. They
go in field groups of at most 128 ids (DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP): the FAST ones
watched and read every interval, the SLOW ones (cumulative counters, per-link fields) watched
every SLOW_EVERY_S and read that often. A value DCGM answers NOT_SUPPORTED or NOT_PERMISSIONED
(the blank sentinels of dcgmvalue.py) marks that field unsupported on that GPU: logged once,
never emitted again, listed by `unsupported_fields()` (what `proof-agent doctor` prints).

The other DCGM source — scraping an existing dcgm-exporter — is `dcgm_exporter.py`.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.collectors.nvml import NVML_SIGNALS
from contract import dcgm_fields, signals
from contract.dcgm_fields import DcgmField

log = logging.getLogger(__name__)

DEFAULT_BINDINGS_PATHS: tuple[str, ...] = (
    "/usr/local/dcgm/bindings/python3",
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
)
# The profiling (DCP) fields: DCGM field id -> docs/design.md §4 name (what NVML cannot read).
PROFILING_FIELDS: dict[int, str] = {
    f.id: f.name for f in dcgm_fields.FIELDS if f.name.startswith(signals.DCGM_PROF_PREFIX)
}
# What the collector watches by default: every table field NVML does not already read.
DEFAULT_FIELDS: tuple[DcgmField, ...] = tuple(
    f for f in dcgm_fields.FIELDS if f.name not in NVML_SIGNALS
)
MAX_FIELDS_PER_GROUP = 128  # DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP (dcgm_structs.h)
# dcgmvalue.py: blank sentinels meaning "this GPU cannot report this field" (NOT_SUPPORTED,
# NOT_PERMISSIONED), as int32, int64 and fp64; the other blanks (BLANK, NOT_FOUND) are "no value
# yet" and are only skipped.
INT32_BLANK, INT64_BLANK, FP64_BLANK = 0x7FFFFFF0, 0x7FFFFFFFFFFFFFF0, 140737488355328.0
UNSUPPORTED_VALUES: frozenset[float] = frozenset(
    {
        INT32_BLANK + 2,
        INT32_BLANK + 3,
        INT64_BLANK + 2,
        INT64_BLANK + 3,
        FP64_BLANK + 2.0,
        FP64_BLANK + 3.0,
    }
)
UPDATE_FREQ_US = 1_000_000  # 1 s, the agent's interval
MAX_KEEP_AGE_S = 30.0
Record = dict[str, Any]


class DcgmUnavailable(Exception):
    """The bindings cannot be used on this node; the message says why."""


@dataclass
class Bindings:
    pydcgm: Any
    dcgm_structs: Any


def load_bindings(paths: Sequence[str | Path] = DEFAULT_BINDINGS_PATHS) -> Bindings:
    """Import pydcgm and dcgm_structs from the first of `paths` that has them."""
    tried = []
    for path in paths:
        p = Path(path)
        if not (p / "pydcgm.py").is_file():
            tried.append(str(p))
            continue
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
        try:
            pydcgm = importlib.import_module("pydcgm")
            dcgm_structs = importlib.import_module("dcgm_structs")
        except Exception as exc:  # a broken install raises anything at import time
            raise DcgmUnavailable(f"DCGM bindings in {p} failed to import: {exc!r}") from exc
        return Bindings(pydcgm, dcgm_structs)
    raise DcgmUnavailable(
        "DCGM Python bindings not found (looked for pydcgm.py in "
        + ", ".join(tried)
        + ") — DCGM is not installed, or set dcgm.bindings_path"
    )


class DcgmCollector:
    """Latest profiling values per GPU from the DCGM host engine, at each `collect(now)`."""

    name = "dcgm"

    def __init__(
        self,
        *,
        node: str | None = None,
        host: str = "127.0.0.1",
        bindings_paths: Sequence[str | Path] = DEFAULT_BINDINGS_PATHS,
        bindings: Bindings | None = None,
        loader: Callable[[Sequence[str | Path]], Bindings] = load_bindings,
        gpu_uuid: Callable[[int], str | None] | None = None,
        retry_after_s: float = 60.0,
        fields: Sequence[DcgmField] = DEFAULT_FIELDS,
        slow_every_s: float = dcgm_fields.SLOW_EVERY_S,
        slow_resend_s: float = 60.0,
    ) -> None:
        self.node = node or socket.gethostname()
        self.host = host
        self.bindings_paths = bindings_paths
        self._bindings = bindings
        self._loader = loader
        self._gpu_uuid = gpu_uuid
        self.retry_after_s = retry_after_s
        self.available: bool | None = None
        self.unavailable_reason: str | None = None
        self._handle: Any = None
        self._group: Any = None
        self.fields = tuple(fields)
        self.slow_every_s = slow_every_s
        self._names = {f.id: f.name for f in self.fields}
        # (rate, field group, its ids) in watch order; FAST ones read every collect, SLOW
        # every slow_every_s
        self._field_groups: list[tuple[str, Any, frozenset[int]]] = []
        self._next_slow: float | None = None
        # SLOW fields are sent when they change, else every slow_resend_s (most are error
        # counters that stay 0 for weeks): (gpu, field) -> (value, when last sent)
        self.slow_resend_s = slow_resend_s
        self._slow_ids = frozenset(f.id for f in self.fields if f.rate == dcgm_fields.SLOW)
        self._sent: dict[tuple[int, int], tuple[float, float]] = {}
        self._unsupported: dict[int, set[int]] = {}  # gpu id -> field ids NOT_SUPPORTED there
        self._identity: dict[int, Record] = {}
        self._uuids: dict[int, str | None] = {}
        self._read_error_reported = False
        self._retryable = False
        self._retry_at: float | None = None

    def start(self) -> bool:
        if self.available is not None:
            return self.available
        try:
            b = self._bindings or self._loader(self.bindings_paths)
            self._bindings = b
            structs = b.dcgm_structs
            if self.host == "embedded":
                # In-process host engine: needs root and the DCGM libraries, no nv-hostengine.
                self._handle = b.pydcgm.DcgmHandle(
                    ipAddress=None, opMode=structs.DCGM_OPERATION_MODE_AUTO
                )
            else:
                self._handle = b.pydcgm.DcgmHandle(
                    ipAddress=self.host, opMode=structs.DCGM_OPERATION_MODE_AUTO
                )
            self._group = b.pydcgm.DcgmGroup(self._handle, groupId=structs.DCGM_GROUP_ALL_GPUS)
            self._watch(b)
        except DcgmUnavailable as exc:
            return self._unavailable(str(exc), retry=False)
        except Exception as exc:
            # The bindings are there but the host engine did not answer (not started yet,
            # restarting): worth asking again later, unlike missing bindings.
            self._delete_field_groups()
            self._handle = self._group = None
            return self._unavailable(_explain(exc, self.host), retry=True)
        self.available = True
        self.unavailable_reason = None
        return True

    def _unavailable(self, reason: str, *, retry: bool) -> bool:
        self.available = False
        self._retryable = retry
        if reason != self.unavailable_reason:
            log.warning("DCGM bindings unavailable: %s", reason)
        self.unavailable_reason = reason
        return False

    def _watch(self, b: Bindings) -> None:
        """Field groups of at most MAX_FIELDS_PER_GROUP ids per rate, each watched at its rate."""
        for rate, every_us, keep_s in (
            (dcgm_fields.FAST, UPDATE_FREQ_US, MAX_KEEP_AGE_S),
            (dcgm_fields.SLOW, int(self.slow_every_s * 1e6), 3 * self.slow_every_s),
        ):
            ids = [f.id for f in self.fields if f.rate == rate]
            for n, chunk in enumerate(range(0, len(ids), MAX_FIELDS_PER_GROUP)):
                group = b.pydcgm.DcgmFieldGroup(
                    self._handle,
                    name=f"proof-agent-{os.getpid()}-{rate}-{n}",
                    fieldIds=ids[chunk : chunk + MAX_FIELDS_PER_GROUP],
                )
                self._field_groups.append(
                    (rate, group, frozenset(ids[chunk : chunk + MAX_FIELDS_PER_GROUP]))
                )
                self._group.samples.WatchFields(group, every_us, keep_s, 0)

    def _delete_field_groups(self) -> None:
        for _rate, group, _ids in self._field_groups:
            if hasattr(group, "Delete"):
                try:
                    group.Delete()
                except Exception:
                    log.debug("DCGM field group Delete failed during close", exc_info=True)
        self._field_groups = []

    def close(self) -> None:
        self._delete_field_groups()
        if self._handle is not None and hasattr(self._handle, "Shutdown"):
            try:
                self._handle.Shutdown()
            except Exception:
                log.debug("DCGM Shutdown failed during close", exc_info=True)
        self._handle = self._group = None
        self._next_slow = None
        self.available = None

    def unsupported_fields(self) -> dict[int, list[str]]:
        """GPU id -> names of the fields DCGM answered NOT_SUPPORTED (or NOT_PERMISSIONED) for
        on that GPU, in table order: skipped from then on."""
        order = {f.id: i for i, f in enumerate(self.fields)}
        return {
            gpu: [self._names[i] for i in sorted(ids, key=order.__getitem__)]
            for gpu, ids in sorted(self._unsupported.items())
        }

    def collect(self, now: float) -> list[Record]:
        if self.available is False and self._retryable and now >= (self._retry_at or 0.0):
            self.available = None  # time to ask the host engine again
        attempted = self.available is None
        if not self.start():
            if attempted and self._retryable:
                self._retry_at = now + self.retry_after_s
            return []
        slow = self._next_slow is None or now >= self._next_slow
        if slow:
            self._next_slow = now + self.slow_every_s
        out: list[Record] = []
        try:
            for rate, group, ids in self._field_groups:
                if rate == dcgm_fields.SLOW and not slow:
                    continue
                values = self._group.samples.GetLatest(group).values
                out += self.records_from_values(values, now, ids)
        except Exception as exc:
            if self._read_error_reported:
                return []
            self._read_error_reported = True
            log.warning("DCGM GetLatest failed: %s", exc)
            return [
                {
                    "type": "event",
                    "ts": now,
                    "name": signals.EVENT_COLLECTOR_ERROR,
                    "node": self.node,
                    "text": f"dcgm GetLatest: {_explain(exc, self.host)}",
                    "labels": {"collector": self.name},
                }
            ]
        self._read_error_reported = False
        return out

    def records_from_values(
        self,
        per_gpu: dict[int, dict[int, Any]],
        now: float,
        only: frozenset[int] | None = None,
    ) -> list[Record]:
        """`{gpuId: {fieldId: series}}` → samples, skipping blank values, unwatched fields and
        (when given) fields outside `only` (the group read); a NOT_SUPPORTED value marks the
        field unsupported on that GPU (see module doc)."""
        out: list[Record] = []
        names = self._names
        for gpu_id in sorted(per_gpu):
            fields = per_gpu[gpu_id]
            identity = self._identity.get(gpu_id)
            if identity is None:
                identity = {"node": self.node, "gpu_index": int(gpu_id)}
                uuid = self._uuid_of(int(gpu_id))
                if uuid:
                    identity["gpu"] = uuid
                self._identity[gpu_id] = identity
            unsupported = self._unsupported.get(gpu_id)
            for field_id, series in fields.items():
                name = names.get(int(field_id))
                if name is None or len(series) == 0 or (only is not None and field_id not in only):
                    continue
                if unsupported is not None and field_id in unsupported:
                    continue
                latest = series[-1]
                value = latest.value
                if getattr(latest, "isBlank", False) or value is None:
                    if isinstance(value, int | float) and value in UNSUPPORTED_VALUES:
                        unsupported = self._mark_unsupported(gpu_id, int(field_id))
                    continue
                try:
                    value = float(value)
                except (TypeError, ValueError):
                    continue
                if field_id in self._slow_ids:
                    key = (gpu_id, field_id)
                    sent = self._sent.get(key)
                    if sent is not None and sent[0] == value and now - sent[1] < self.slow_resend_s:
                        continue
                    self._sent[key] = (value, now)
                out.append({"type": "sample", "ts": now, "name": name, "value": value, **identity})
        return out

    def _mark_unsupported(self, gpu_id: int, field_id: int) -> set[int]:
        ids = self._unsupported.setdefault(gpu_id, set())
        if not ids:
            log.info("DCGM: GPU %s does not support some fields; skipped from now on", gpu_id)
        ids.add(field_id)
        log.debug("DCGM: GPU %s: %s not supported", gpu_id, self._names[field_id])
        return ids

    def _uuid_of(self, gpu_id: int) -> str | None:
        if gpu_id not in self._uuids:
            uuid: str | None = None
            if self._gpu_uuid is not None:
                uuid = self._gpu_uuid(gpu_id)
            if uuid is None and self._handle is not None:
                try:
                    attrs = self._handle.GetSystem().discovery.GetGpuAttributes(gpu_id)
                    uuid = str(attrs.identifiers.uuid) or None
                except Exception:
                    uuid = None
            self._uuids[gpu_id] = uuid
        return self._uuids[gpu_id]


def _explain(exc: BaseException, host: str) -> str:
    text = str(exc) or exc.__class__.__name__
    lowered = text.lower()
    if "connection" in lowered or "connect" in lowered:
        return f"cannot reach the DCGM host engine at {host} ({text}) — is nv-hostengine running?"
    if "library" in lowered and "not found" in lowered:
        return f"libdcgm.so not found ({text}) — the DCGM package is not installed"
    if "not supported" in lowered or "profiling" in lowered:
        return f"DCGM profiling fields not supported on these GPUs ({text})"
    return text
