"""DCGM profiling fields through DCGM's own Python bindings (pydcgm), when they are installed.

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

from contract import signals

log = logging.getLogger(__name__)

DEFAULT_BINDINGS_PATHS: tuple[str, ...] = (
    "/usr/local/dcgm/bindings/python3",
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
)
# DCGM field ids (dcgm_fields.py) → docs/design.md §4 names.
PROFILING_FIELDS: dict[int, str] = {
    1001: signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
    1002: signals.DCGM_FI_PROF_SM_ACTIVE,
    1003: signals.DCGM_FI_PROF_SM_OCCUPANCY,
    1004: signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
    1005: signals.DCGM_FI_PROF_DRAM_ACTIVE,
    1009: signals.DCGM_FI_PROF_PCIE_TX_BYTES,
    1010: signals.DCGM_FI_PROF_PCIE_RX_BYTES,
    1011: signals.DCGM_FI_PROF_NVLINK_TX_BYTES,
    1012: signals.DCGM_FI_PROF_NVLINK_RX_BYTES,
}
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
        self._field_group: Any = None
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
            self._field_group = b.pydcgm.DcgmFieldGroup(
                self._handle,
                name=f"proof-agent-{os.getpid()}",
                fieldIds=list(PROFILING_FIELDS),
            )
            self._group.samples.WatchFields(self._field_group, UPDATE_FREQ_US, MAX_KEEP_AGE_S, 0)
        except DcgmUnavailable as exc:
            return self._unavailable(str(exc), retry=False)
        except Exception as exc:
            # The bindings are there but the host engine did not answer (not started yet,
            # restarting): worth asking again later, unlike missing bindings.
            self._handle = self._group = self._field_group = None
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

    def close(self) -> None:
        for obj, method in ((self._field_group, "Delete"), (self._handle, "Shutdown")):
            if obj is not None and hasattr(obj, method):
                try:
                    getattr(obj, method)()
                except Exception:
                    log.debug("DCGM %s failed during close", method, exc_info=True)
        self._handle = self._group = self._field_group = None
        self.available = None

    def collect(self, now: float) -> list[Record]:
        if self.available is False and self._retryable and now >= (self._retry_at or 0.0):
            self.available = None  # time to ask the host engine again
        attempted = self.available is None
        if not self.start():
            if attempted and self._retryable:
                self._retry_at = now + self.retry_after_s
            return []
        try:
            latest = self._group.samples.GetLatest(self._field_group)
            per_gpu = latest.values
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
        return self.records_from_values(per_gpu, now)

    def records_from_values(self, per_gpu: dict[int, dict[int, Any]], now: float) -> list[Record]:
        """`{gpuId: {fieldId: series}}` → samples, skipping blank values and unknown fields."""
        out: list[Record] = []
        for gpu_id in sorted(per_gpu):
            fields = per_gpu[gpu_id]
            identity: Record = {"node": self.node, "gpu_index": int(gpu_id)}
            uuid = self._uuid_of(int(gpu_id))
            if uuid:
                identity["gpu"] = uuid
            for field_id, series in fields.items():
                name = PROFILING_FIELDS.get(int(field_id))
                if name is None or len(series) == 0:
                    continue
                latest = series[-1]
                if getattr(latest, "isBlank", False) or latest.value is None:
                    continue
                try:
                    value = float(latest.value)
                except (TypeError, ValueError):
                    continue
                out.append({"type": "sample", "ts": now, "name": name, "value": value, **identity})
        return out

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
