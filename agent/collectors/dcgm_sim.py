"""A simulated DCGM host engine behind pydcgm-shaped bindings, for the real `DcgmCollector`.

Like `nvml_sim.SimulatedNvml` stands in for `pynvml`, `simulated_bindings()` stands in for the
`pydcgm`/`dcgm_structs` pair: `DcgmHandle`, `DcgmGroup(...).samples.WatchFields/GetLatest`,
`DcgmFieldGroup` (at most 128 ids, as DCGM enforces) and `GetSystem().discovery
.GetGpuAttributes()`. The values come from `simulator.dcgm_fields.SimDcgmGpu` (derived from a
simulated run's hardware arrays) at the sample the engine's clock points at (`set_time`); a
field the modelled GPU lacks reads DCGM's NOT_SUPPORTED sentinel, so the collector's skip-once
path runs as on a real node. `calls` counts GetLatest per field group for the tests.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from agent.collectors.dcgm import FP64_BLANK, INT64_BLANK, MAX_FIELDS_PER_GROUP, Bindings

if TYPE_CHECKING:
    # Only for the annotation: `proof-agent bench` imports this module in the measured process
    # (the field values' shape), where the simulator and numpy do not belong (issue 17).
    from simulator.dcgm_fields import SimDcgmGpu

GROUP_ALL_GPUS = 0x7FFFFFFF
OPERATION_MODE_AUTO = 1


@dataclass(slots=True)
class SimFieldValue:
    """Shaped like dcgm_field_helpers.DcgmFieldValue."""

    fieldId: int
    value: float | int
    ts: int
    isBlank: bool


class SimulatedDcgm:
    """The host engine: per-GPU models, a clock (sample index) and what was watched."""

    def __init__(self, gpus: list[SimDcgmGpu], uuids: list[str]) -> None:
        self.gpus = gpus
        self.uuids = uuids
        self.t = 0
        self.watched: list[tuple[tuple[int, ...], int, float]] = []
        self.calls: collections.Counter[str] = collections.Counter()
        self.fail: str | None = None  # "connect" or "read": raise as a dead host engine does

    def set_time(self, t: int) -> None:
        self.t = max(0, t)

    def latest(self, field_ids: list[int]) -> dict[int, dict[int, list[SimFieldValue]]]:
        out: dict[int, dict[int, list[SimFieldValue]]] = {}
        ts = self.t * 1_000_000
        for gpu in self.gpus:
            row: dict[int, list[SimFieldValue]] = {}
            for fid, value in gpu.values(self.t, field_ids).items():
                blank = value >= INT64_BLANK or (isinstance(value, float) and value >= FP64_BLANK)
                row[fid] = [SimFieldValue(fid, value, ts, blank)]
            out[gpu.index] = row
        return out

    def bindings(self) -> Bindings:
        engine = self

        class DcgmHandle:
            def __init__(self, ipAddress: str | None = None, opMode: int = 0) -> None:
                if engine.fail == "connect":
                    raise ConnectionError("Host engine connection invalid/disconnected")

            def GetSystem(self) -> Any:
                def attrs(gpu_id: int) -> Any:
                    return SimpleNamespace(identifiers=SimpleNamespace(uuid=engine.uuids[gpu_id]))

                return SimpleNamespace(discovery=SimpleNamespace(GetGpuAttributes=attrs))

            def Shutdown(self) -> None:
                pass

        class Samples:
            def WatchFields(self, fg: Any, freq_us: int, age_s: float, keep: int) -> None:
                engine.watched.append((tuple(fg.fieldIds), freq_us, age_s))

            def GetLatest(self, fg: Any) -> Any:
                if engine.fail == "read":
                    raise ConnectionError("Host engine connection invalid/disconnected")
                engine.calls[fg.name] += 1
                return SimpleNamespace(values=engine.latest(fg.fieldIds))

        class DcgmGroup:
            def __init__(self, handle: Any, groupId: int | None = None) -> None:
                self.samples = Samples()

        class DcgmFieldGroup:
            def __init__(self, handle: Any, name: str = "", fieldIds: list[int] | None = None):
                ids = list(fieldIds or [])
                if len(ids) > MAX_FIELDS_PER_GROUP:
                    raise ValueError(f"DCGM_ST_MAX_LIMIT: {len(ids)} fields in one group")
                self.name, self.fieldIds = name, ids

            def Delete(self) -> None:
                pass

        return Bindings(
            pydcgm=SimpleNamespace(
                DcgmHandle=DcgmHandle, DcgmGroup=DcgmGroup, DcgmFieldGroup=DcgmFieldGroup
            ),
            dcgm_structs=SimpleNamespace(
                DCGM_GROUP_ALL_GPUS=GROUP_ALL_GPUS, DCGM_OPERATION_MODE_AUTO=OPERATION_MODE_AUTO
            ),
        )
