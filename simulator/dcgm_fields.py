"""The rest of the DCGM field table (contract.dcgm_fields) for a simulated GPU, derived from what
hardware.py computed: the pipes from the SM/tensor activity, energy and violation times from
power and the throttle bits, cycle counters from the clock, NVLink traffic from DRAM activity,
per-link error counters from the GPU's CRC total, and so on.

Values are computed per read (`values(t, ids)`), not as whole-run arrays: 200 fields x 8 GPUs x
a 30-minute run would be ~25 MB of arrays held only to be read once. The cumulative inputs
(energy, violation and cycle sums) are cumulative sums over the base arrays, built once.

A field the modelled GPU would not report (contract.dcgm_fields `support`: no video encoder on
an H100/A100, no page retirement after Volta, no vGPU, links beyond the GPU's count) reads
NOT_SUPPORTED, as DCGM answers; a GPU the model lost reads BLANK.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contract import dcgm_fields as F
from contract import signals
from contract.signals import Kind
from simulator.hardware import GpuSpec

# dcgmvalue.py sentinels the simulated host engine answers with.
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
INT64_NOT_SUPPORTED = INT64_BLANK + 2
FP64_BLANK = 140737488355328.0
FP64_NOT_SUPPORTED = FP64_BLANK + 2.0

_MIB = 1024 * 1024
_HOPPER_SMS = 132
_NVLINK_PEAK_BPS = 25e9  # per link per direction (H100: 18 links, 450 GB/s each way)
_PCIE_PEAK_BPS = 64e9
_PCIE_TX_SHARE, _PCIE_RX_SHARE = 0.02, 0.035  # of the link: metrics/checkpoints out, data in
_HBM_CLOCK_MHZ = {"H100": 2619, "H200": 3201, "A100": 1593}


def _family(spec: GpuSpec) -> str:
    name = spec.name.upper()
    for fam in ("H200", "H100", "A100", "V100"):
        if fam in name:
            return fam
    return "H100"


def supported(spec: GpuSpec, f: F.DcgmField) -> bool:
    """Whether the modelled GPU reports field `f` (see contract.dcgm_fields.SUPPORT)."""
    fam = _family(spec)
    if f.link is not None and f.link >= spec.nvlinks:
        return False
    if f.support in (F.NVENC, F.VGPU):
        return False  # datacenter training parts: no encoder; not a vGPU guest
    if f.support == F.PRE_AMPERE:
        return fam == "V100"
    if f.support == F.AMPERE_PLUS:
        return fam != "V100"
    return not (f.support == F.NVLINK and spec.nvlinks == 0)


@dataclass
class SimDcgmGpu:
    """One simulated GPU's DCGM fields over a run: `base` holds hardware.py's arrays (DCGM name
    -> values per sample, NaN where the GPU reported nothing)."""

    index: int
    base: dict[str, np.ndarray]
    spec: GpuSpec
    interval_s: float = 1.0
    _cum: dict[str, np.ndarray] = field(default_factory=dict)
    _n: int = 0

    def __post_init__(self) -> None:
        self._n = max((len(a) for a in self.base.values()), default=0)
        self._supported = {f.id: supported(self.spec, f) for f in F.FIELDS}
        self._crc_link = self.index % max(1, self.spec.nvlinks)
        self._mem_clock = _HBM_CLOCK_MHZ.get(_family(self.spec), 2619)
        # Values that never change on this GPU (unsupported fields, constants, healthy-link
        # zeros): found once by reading every field at two samples, so a read costs a lookup.
        self._static: dict[int, float | int] = {}
        for f in F.FIELDS:
            if not self._supported[f.id]:
                self._static[f.id] = INT64_NOT_SUPPORTED
            elif f.name not in self.base and self._is_constant(f):
                self._static[f.id] = self._value(f, 0)

    def _is_constant(self, f: F.DcgmField) -> bool:
        """No input of `f` varies over the run (checked at 16 samples spread over it)."""
        last = max(0, self._n - 1)
        samples = {self._value(f, t) for t in range(0, last + 1, max(1, last // 15))}
        if len(samples) > 1:
            return False
        return f.kind is not Kind.COUNTER or self._value(f, max(0, self._n - 1)) == 0

    def _at(self, name: str, t: int, default: float = 0.0) -> float:
        arr = self.base.get(name)
        if arr is None or t >= len(arr):
            return default
        v = float(arr[t])
        return default if v != v else v

    def _cumulative(self, key: str, t: int) -> float:
        """Sum over samples 0..t of a per-sample quantity (built once per quantity)."""
        arr = self._cum.get(key)
        if arr is None:
            arr = np.cumsum(np.nan_to_num(np.asarray(self._per_sample(key), dtype=float)))
            self._cum[key] = arr
        return float(arr[min(t, len(arr) - 1)]) if len(arr) else 0.0

    def _per_sample(self, key: str) -> Any:
        n = self._n
        b = self.base

        def get(name: str) -> np.ndarray:
            out: np.ndarray = np.nan_to_num(np.asarray(b.get(name, np.zeros(n)), dtype=float))
            return out

        dt_ns = self.interval_s * 1e9
        bits = get(signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS).astype(np.int64)
        cycles = get(signals.DCGM_FI_DEV_SM_CLOCK) * 1e6 * self.interval_s * _HOPPER_SMS
        if key == "energy_mj":
            return get(signals.DCGM_FI_DEV_POWER_USAGE) * self.interval_s * 1000.0
        if key == "power_violation":
            return ((bits & signals.THROTTLE_SW_POWER_CAP) != 0) * dt_ns
        if key == "thermal_violation":
            thermal = signals.THROTTLE_SW_THERMAL | signals.THROTTLE_HW_THERMAL
            return ((bits & thermal) != 0) * dt_ns
        if key == "reliability_violation":
            return ((bits & signals.THROTTLE_HW_SLOWDOWN) != 0) * dt_ns
        if key == "any_violation":
            return (bits != 0) * dt_ns
        if key == "cycles":
            return cycles
        if key == "sm_cycles":
            return cycles * get(signals.DCGM_FI_PROF_SM_ACTIVE)
        if key == "mma_cycles":
            return cycles * get(signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)
        if key == "fp32_cycles":
            return cycles * 0.12 * get(signals.DCGM_FI_PROF_SM_ACTIVE)
        if key == "fp16_cycles":
            return cycles * 0.05 * get(signals.DCGM_FI_PROF_SM_ACTIVE)
        if key == "int_cycles":
            return cycles * 0.08 * get(signals.DCGM_FI_PROF_SM_ACTIVE)
        if key in ("pcie_tx", "pcie_rx"):
            share = _PCIE_TX_SHARE if key == "pcie_tx" else _PCIE_RX_SHARE
            engine = get(signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE)
            return _PCIE_PEAK_BPS * share * engine * self.interval_s
        raise KeyError(key)

    def values(self, t: int, ids: list[int]) -> dict[int, float | int]:
        """Field id -> the value DCGM would return at sample `t` (sentinels included)."""
        if self._at(signals.DCGM_FI_DEV_GPU_UTIL, t, -1.0) < 0:
            return dict.fromkeys(ids, INT64_BLANK)  # lost: the host engine has no value
        static = self._static
        out: dict[int, float | int] = {}
        for fid in ids:
            value = static.get(fid)
            if value is None:
                f = F.BY_ID.get(fid)
                value = INT64_NOT_SUPPORTED if f is None else self._value(f, t)
            out[fid] = value
        return out

    def _value(self, f: F.DcgmField, t: int) -> float | int:
        name = f.name
        if name in self.base:
            return self._at(name, t)
        at = self._at
        sm = at(signals.DCGM_FI_PROF_SM_ACTIVE, t)
        tensor = at(signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, t)
        dram = at(signals.DCGM_FI_PROF_DRAM_ACTIVE, t)
        nvlink_bps = _NVLINK_PEAK_BPS * 0.6 * dram  # per link per direction
        if f.link is not None:
            if "CRC_FLIT" in name:
                crc = int(at(signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, t))
                return crc if f.link == self._crc_link else 0
            if "BANDWIDTH" in name:
                return round(2 * nvlink_bps / _MIB, 1)
            if name.endswith(("_TX_BYTES", "_RX_BYTES")):
                return round(nvlink_bps)
            return 0  # CRC data, replay, recovery: healthy links
        simple: dict[str, float | int] = {
            "DCGM_FI_DEV_MEM_CLOCK": self._mem_clock,
            "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": self.spec.pcie_gen,
            "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": self.spec.pcie_width,
            "DCGM_FI_DEV_MEM_COPY_UTIL": round(100 * dram),
            "DCGM_FI_DEV_DEC_UTIL": 0,
            "DCGM_FI_DEV_XID_ERRORS": 0,
            "DCGM_FI_DEV_FB_RESERVED": self.spec.fb_reserved_mib,
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": round(
                2 * nvlink_bps * self.spec.nvlinks / _MIB, 1
            ),
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.0,
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE": round(0.12 * sm, 4),
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE": round(0.05 * sm, 4),
            "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": tensor,
            "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE": 0.0,
            "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE": 0.0,
            "DCGM_FI_PROF_PIPE_INT_ACTIVE": round(0.08 * sm, 4),
            "DCGM_FI_PROF_NVLINK_TX_BYTES": round(nvlink_bps * self.spec.nvlinks),
            "DCGM_FI_PROF_NVLINK_RX_BYTES": round(nvlink_bps * self.spec.nvlinks),
        }
        if name in simple:
            return simple[name]
        cumulative = {
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy_mj",
            "DCGM_FI_DEV_POWER_VIOLATION": "power_violation",
            "DCGM_FI_DEV_THERMAL_VIOLATION": "thermal_violation",
            "DCGM_FI_DEV_RELIABILITY_VIOLATION": "reliability_violation",
            "DCGM_FI_DEV_TOTAL_APP_CLOCKS_VIOLATION": "any_violation",
            "DCGM_FI_DEV_TOTAL_BASE_CLOCKS_VIOLATION": "any_violation",
            "DCGM_FI_PROF_SM_CYCLES_ELAPSED_TOTAL": "cycles",
            "DCGM_FI_PROF_SM_CYCLES_ACTIVE_TOTAL": "sm_cycles",
            "DCGM_FI_PROF_MMA_CYCLES_ACTIVE_TOTAL": "mma_cycles",
            "DCGM_FI_PROF_HMMA_CYCLES_ACTIVE_TOTAL": "mma_cycles",
            "DCGM_FI_PROF_FP32_CYCLES_ACTIVE_TOTAL": "fp32_cycles",
            "DCGM_FI_PROF_FP16_CYCLES_ACTIVE_TOTAL": "fp16_cycles",
            "DCGM_FI_PROF_INT_CYCLES_ACTIVE_TOTAL": "int_cycles",
            "DCGM_FI_PROF_PCIE_TX_BYTES_TOTAL": "pcie_tx",
            "DCGM_FI_PROF_PCIE_RX_BYTES_TOTAL": "pcie_rx",
        }.get(name)
        if cumulative is not None:
            return int(self._cumulative(cumulative, t))
        if name == "DCGM_FI_PROF_PCIE_TX_BYTES":
            return round(
                _PCIE_PEAK_BPS * _PCIE_TX_SHARE * at(signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE, t)
            )
        if name == "DCGM_FI_PROF_PCIE_RX_BYTES":
            return round(
                _PCIE_PEAK_BPS * _PCIE_RX_SHARE * at(signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE, t)
            )
        # the rest (per-location ECC, other violations, DMMA/DFMA/FP64 cycles): zero on a
        # healthy GPU; the DRAM location carries the volatile totals
        if name == "DCGM_FI_DEV_ECC_SBE_VOL_DEV":
            return int(at(signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, t))
        if name == "DCGM_FI_DEV_ECC_DBE_VOL_DEV":
            return int(at(signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, t))
        return 0
