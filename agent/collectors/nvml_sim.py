"""A simulated `pynvml` module: the NVML functions the agent calls, backed by per-GPU state.

It stands in for the one thing that cannot exist on a machine without a GPU. Constants, the
`NVMLError` class hierarchy and the ctypes result structures are taken from the real `pynvml`
module, so the collector's error handling and field access run exactly as on a GPU node: a
simulated failure raises the real `pynvml.NVMLError_NotSupported`, `NVMLError_GPUIsLost`, ….

Fault injection, per GPU: `unsupported` (function names answering NotSupported), `errors`
(function name → NVML error code raised on every call), `lost` (every call raises GPU_IS_LOST);
module-wide: `driver_missing` (nvmlInit raises LIBRARY_NOT_FOUND) and `push_xid()` (queues an
XID event; XID 79 also makes the GPU lost, as the real driver does). `calls` counts calls per
function name so tests can check that an unsupported reading is not retried every second.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import pynvml as _real

from contract import signals

GIB = 1024**3


@dataclass
class SimGpu:
    """The state one simulated GPU reports. Set fields directly to drive a test or demo."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * GIB  # bytes
    memory_used: int = 0  # bytes
    util_gpu: int = 0  # %
    util_memory: int = 0  # %
    power_mw: int = 70_000
    temp_c: int = 35
    memory_temp_c: int = 40
    sm_clock_mhz: int = 1980
    throttle_reasons: int = 0
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_replay: int = 0
    # (error type, counter type) → count; see NVML_MEMORY_ERROR_TYPE_* / NVML_*_ECC
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failure
    nvlink_crc_flit: list[int] = field(default_factory=lambda: [0] * 18)  # one per active link
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used bytes)
    pci_bus_id: str = ""  # NVML's form, "00000000:1B:00.0"; empty = derived from the index
    unsupported: set[str] = field(default_factory=set)
    errors: dict[str, int] = field(default_factory=dict)
    lost: bool = False


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass
class SimEventData:
    """Same field names as pynvml.c_nvmlEventData_t (whose `device` member cannot hold a
    simulated handle)."""

    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class SimulatedNvml:
    """Drop-in for the `pynvml` module (the subset the agent uses)."""

    def __init__(
        self,
        gpus: list[SimGpu] | None = None,
        *,
        driver_version: str = "550.90.07",
        cuda_version: int = 12040,
    ) -> None:
        for name in dir(_real):
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "c_nvml")):
                setattr(self, name, getattr(_real, name))
        self.NVMLError = _real.NVMLError
        self.gpus: list[SimGpu] = list(gpus or [])
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.driver_missing = False
        self.initialised = False
        self.calls: collections.Counter[str] = collections.Counter()
        self._events: collections.deque[SimEventData] = collections.deque()
        self._registered: dict[int, int] = {}  # gpu index → event mask
        self.hardware: dict[str, Any] | None = None

    @classmethod
    def with_gpus(cls, count: int, **kwargs: Any) -> SimulatedNvml:
        gpus = [SimGpu(uuid=f"GPU-{i:08x}-5f3c-4e7a-9b1d-{i:012x}", **kwargs) for i in range(count)]
        return cls(gpus)

    @classmethod
    def from_hardware(
        cls, arrays: dict[str, Any], uuids: list[str], *, name: str = "NVIDIA H100 80GB HBM3"
    ) -> SimulatedNvml:
        """A simulated NVML backed by `simulator.hardware.simulate_gpus()` output (arrays of
        shape (n_gpus, n_samples), DCGM names); `set_sample(t)` moves every GPU to column t.
        A GPU whose readings are NaN/-1 at t (the model's "lost") raises GPU_IS_LOST."""
        nv = cls([SimGpu(uuid=u, name=name, nvlink_crc_flit=[0]) for u in uuids])
        nv.hardware = arrays
        nv.set_sample(0)
        return nv

    def set_sample(self, t: int) -> None:
        hw = self.hardware
        if hw is None:
            raise ValueError("set_sample needs a simulator built with from_hardware()")
        corrected, uncorrected = (
            _real.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            _real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        )
        volatile = _real.NVML_VOLATILE_ECC
        for i, g in enumerate(self.gpus):

            def at(name: str, default: float = 0.0, i: int = i) -> float:
                arr = hw.get(name)
                return default if arr is None else float(arr[i, t])

            util = at(signals.DCGM_FI_DEV_GPU_UTIL)
            if util != util or util < 0:  # NaN or -1: the model lost this GPU
                g.lost = True
                continue
            mib = 1024 * 1024
            used = int(at(signals.DCGM_FI_DEV_FB_USED))
            g.util_gpu = int(util)
            g.memory_used = used * mib
            g.memory_total = (used + int(at(signals.DCGM_FI_DEV_FB_FREE))) * mib
            g.power_mw = round(at(signals.DCGM_FI_DEV_POWER_USAGE) * 1000)
            g.temp_c = round(at(signals.DCGM_FI_DEV_GPU_TEMP))
            g.memory_temp_c = round(at(signals.DCGM_FI_DEV_MEMORY_TEMP))
            g.sm_clock_mhz = int(at(signals.DCGM_FI_DEV_SM_CLOCK))
            g.throttle_reasons = int(at(signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS))
            g.pcie_gen = int(at(signals.DCGM_FI_DEV_PCIE_LINK_GEN))
            g.pcie_width = int(at(signals.DCGM_FI_DEV_PCIE_LINK_WIDTH))
            g.pcie_replay = int(at(signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER))
            g.ecc[(corrected, volatile)] = int(at(signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL))
            g.ecc[(uncorrected, volatile)] = int(at(signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL))
            g.remapped_rows = (
                int(at(signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS)),
                int(at(signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS)),
                0,
                int(at(signals.DCGM_FI_DEV_ROW_REMAP_FAILURE)),
            )
            g.nvlink_crc_flit = [int(at(signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL))]

    # --- fault injection -----------------------------------------------------------------------

    def push_xid(self, index: int, xid: int) -> None:
        if self._registered.get(index, 0) & _real.nvmlEventTypeXidCriticalError:
            self._events.append(
                SimEventData(_Handle(index), _real.nvmlEventTypeXidCriticalError, xid)
            )
        if xid == 79:
            self.gpus[index].lost = True

    # --- plumbing ------------------------------------------------------------------------------

    def _raise(self, code: int) -> None:
        raise _real.NVMLError(code)

    def _gpu(self, fn: str, handle: _Handle) -> SimGpu:
        self.calls[fn] += 1
        if not self.initialised:
            self._raise(_real.NVML_ERROR_UNINITIALIZED)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            self._raise(_real.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.unsupported:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        if fn in gpu.errors:
            self._raise(gpu.errors[fn])
        return gpu

    # --- the pynvml API ------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.driver_missing:
            self._raise(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda_version

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialised:
            self._raise(_real.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.gpus):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        return handle.index

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        info = _real.nvmlPciInfo_t()
        info.busId = (gpu.pci_bus_id or f"00000000:{0x18 + 0x10 * handle.index:02X}:00.0").encode()
        return info

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        g = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return _real.c_nvmlUtilization_t(gpu=g.util_gpu, memory=g.util_memory)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: Any = None) -> Any:
        g = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        return _real.c_nvmlMemory_t(
            total=g.memory_total, free=g.memory_total - g.memory_used, used=g.memory_used
        )

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        g = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != _real.NVML_TEMPERATURE_GPU:
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        return g.temp_c

    def nvmlDeviceGetFieldValues(self, handle: _Handle, field_ids: list[int]) -> Any:
        g = self._gpu("nvmlDeviceGetFieldValues", handle)
        values = (_real.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            values[i].fieldId = fid
            if fid == _real.NVML_FI_DEV_MEMORY_TEMP and "NVML_FI_DEV_MEMORY_TEMP" not in (
                g.unsupported
            ):
                values[i].nvmlReturn = _real.NVML_SUCCESS
                values[i].valueType = _real.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = g.memory_temp_c
            else:
                values[i].nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock_type: int) -> int:
        g = self._gpu("nvmlDeviceGetClockInfo", handle)
        if clock_type != _real.NVML_CLOCK_SM:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        return g.sm_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).throttle_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).throttle_reasons

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", handle).pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkWidth", handle).pcie_width

    def nvmlDeviceGetPcieReplayCounter(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPcieReplayCounter", handle).pcie_replay

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter: int) -> int:
        g = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        return g.ecc.get((error_type, counter), 0)

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        return self._gpu("nvmlDeviceGetRemappedRows", handle).remapped_rows

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        g = self._gpu("nvmlDeviceGetNvLinkState", handle)
        if link >= len(g.nvlink_crc_flit):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        return int(_real.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: _Handle, link: int, counter: int) -> int:
        g = self._gpu("nvmlDeviceGetNvLinkErrorCounter", handle)
        if link >= len(g.nvlink_crc_flit):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        if counter != _real.NVML_NVLINK_ERROR_DL_CRC_FLIT:
            return 0
        return g.nvlink_crc_flit[link]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        g = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [_real.c_nvmlProcessInfo_t(pid=pid, usedGpuMemory=used) for pid, used in g.processes]

    # events

    def nvmlEventSetCreate(self) -> object:
        self.calls["nvmlEventSetCreate"] += 1
        return object()

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._registered.clear()

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        self._gpu("nvmlDeviceGetSupportedEventTypes", handle)
        return int(
            _real.nvmlEventTypeXidCriticalError
            | _real.nvmlEventTypeSingleBitEccError
            | _real.nvmlEventTypeDoubleBitEccError
        )

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: Any) -> None:
        self._gpu("nvmlDeviceRegisterEvents", handle)
        self._registered[handle.index] = self._registered.get(handle.index, 0) | int(event_types)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> SimEventData:
        self.calls["nvmlEventSetWait_v2"] += 1
        if not self._events:
            self._raise(_real.NVML_ERROR_TIMEOUT)
        return self._events.popleft()

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> SimEventData:
        return self.nvmlEventSetWait_v2(event_set, timeout_ms)
