"""NVML collector: the GPU vocabulary of docs/design.md §4 per GPU, XID events, and PID → GPU.

The `pynvml` module (nvidia-ml-py) is a constructor argument: the real module on a GPU node,
`agent.collectors.nvml_sim.SimulatedNvml` in tests and demos. Readings carry the DCGM name of
the same quantity (docs/design.md §4) and the identity `node`, `gpu` (UUID), `gpu_index`.

Failure handling, per GPU and per reading:
- `NVMLError_NotSupported` (and other errors that cannot change while the driver is loaded:
  no permission, function not found) → that reading is dropped for that GPU for good; only the
  non-silent ones produce one `collector_error` event.
- any other NVML error → one `collector_error` event per (GPU, reading, error code); the
  reading is retried next interval (it may be transient).
- `NVMLError_GpuIsLost` from any call, or XID 79 → one `gpu_lost` event; the GPU is skipped
  from then on (NVML does not bring a lost GPU back without a reset and an agent restart).
The collector never raises out of `collect()`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract import signals

log = logging.getLogger(__name__)

MIB = 1024 * 1024
XID_FALLEN_OFF_BUS = 79
# Bounds the events drained per interval, so a storm of XIDs cannot stall the agent's loop.
MAX_EVENTS_PER_COLLECT = 256

Record = dict[str, Any]

# The DCGM names this collector emits (per-link NVLink CRC included): the DCGM collector leaves
# them out by default, so a node running both reports each quantity once.
_NVLINK_CRC_LINK = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L{}"
NVML_SIGNALS: frozenset[str] = frozenset(
    {
        signals.DCGM_FI_DEV_GPU_UTIL,
        signals.DCGM_FI_DEV_FB_USED,
        signals.DCGM_FI_DEV_FB_FREE,
        signals.DCGM_FI_DEV_POWER_USAGE,
        signals.DCGM_FI_DEV_GPU_TEMP,
        signals.DCGM_FI_DEV_MEMORY_TEMP,
        signals.DCGM_FI_DEV_SM_CLOCK,
        signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,
        signals.DCGM_FI_DEV_PCIE_LINK_GEN,
        signals.DCGM_FI_DEV_PCIE_LINK_WIDTH,
        signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
        signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL,
        signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,
        signals.DCGM_FI_DEV_ECC_SBE_AGG_TOTAL,
        signals.DCGM_FI_DEV_ECC_DBE_AGG_TOTAL,
        signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,
        signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS,
        signals.DCGM_FI_DEV_ROW_REMAP_PENDING,
        signals.DCGM_FI_DEV_ROW_REMAP_FAILURE,
        signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        *(_NVLINK_CRC_LINK.format(n) for n in range(18)),
    }
)


@dataclass(frozen=True, slots=True)
class GpuRef:
    """One GPU as identity knows it."""

    uuid: str
    index: int


@dataclass(slots=True)
class _Gpu:
    index: int
    handle: Any
    uuid: str
    name: str = ""
    memory_total_mib: float | None = None
    lost: bool = False
    # readings never tried again (NotSupported and other permanent errors)
    disabled: set[str] = field(default_factory=set)
    # (reading, error code) pairs already reported as collector_error
    reported: set[tuple[str, int]] = field(default_factory=set)
    nvlinks: list[int] | None = None  # discovered lazily; [] = no NVLink
    last_dbe_volatile: int | None = None


class NvmlCollector:
    """Per-GPU NVML readings at each `collect(now)` (the agent calls it at 1 Hz)."""

    name = "nvml"

    def __init__(
        self,
        nvml: Any,
        *,
        node: str | None = None,
        collect_processes: bool = True,
        retry_after_s: float = 60.0,
    ) -> None:
        self.nvml = nvml
        self.node = node or socket.gethostname()
        self.collect_processes = collect_processes
        # NVML that failed to start is tried again this often (driver loaded after the agent).
        self.retry_after_s = retry_after_s
        self._retry_at: float | None = None
        self.available: bool | None = None  # None until the first start attempt
        self.unavailable_reason: str | None = None
        self._gpus: list[_Gpu] = []
        self._by_uuid: dict[str, _Gpu] = {}
        self._event_set: Any = None
        self._pending: list[Record] = []
        self._pid_gpus: dict[int, list[GpuRef]] = {}
        self._facts: dict[str, Any] = {}
        self._event_error_reported = False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> bool:
        """Initialise NVML and enumerate the GPUs. False (with `unavailable_reason`) when NVML
        cannot be used on this node; the collector then returns nothing."""
        if self.available is not None:
            return self.available
        nv = self.nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            return self._unavailable(describe_init_error(nv, exc))
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            return self._unavailable(f"nvmlDeviceGetCount failed: {exc}")
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = nv.nvmlDeviceGetUUID(handle)
            except nv.NVMLError as exc:
                # A GPU NVML cannot even name is reported and left out; the others still work.
                self._pending.append(
                    self._error_event(
                        0.0, None, "enumerate", f"GPU index {index}: {exc}", gpu_index=index
                    )
                )
                continue
            gpu = _Gpu(index=index, handle=handle, uuid=str(uuid))
            gpu.name = str(self._static(nv.nvmlDeviceGetName, handle) or "")
            mem = self._static(nv.nvmlDeviceGetMemoryInfo, handle)
            if mem is not None:
                gpu.memory_total_mib = int(mem.total) / MIB
            self._gpus.append(gpu)
            self._by_uuid[gpu.uuid] = gpu
        self._facts = {
            "driver_version": _str_or_none(self._static(nv.nvmlSystemGetDriverVersion)),
            "cuda_version": _cuda_version(self._static(nv.nvmlSystemGetCudaDriverVersion)),
        }
        self._register_events()
        self.available = True
        self.unavailable_reason = None
        return True

    def _unavailable(self, reason: str) -> bool:
        self.available = False
        if reason != self.unavailable_reason:  # retries repeat it; say it once
            log.warning("NVML unavailable: %s", reason)
        self.unavailable_reason = reason
        return False

    def close(self) -> None:
        nv = self.nvml
        if self._event_set is not None:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(self._event_set)
            self._event_set = None
        if self.available:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()
        self.available = None

    # --- public views --------------------------------------------------------------------------

    @property
    def gpus(self) -> list[GpuRef]:
        return [GpuRef(g.uuid, g.index) for g in self._gpus]

    def pid_gpus(self) -> dict[int, list[GpuRef]]:
        """PID → the GPUs it runs compute on, as of the last `collect()`."""
        return self._pid_gpus

    def node_facts(self) -> dict[str, Any]:
        """What registration needs: driver/CUDA version and each GPU's UUID, index, model,
        memory. Empty `gpus` when NVML is unavailable."""
        self.start()
        return {
            "node": self.node,
            "driver_version": self._facts.get("driver_version"),
            "cuda_version": self._facts.get("cuda_version"),
            "gpus": [
                {
                    "uuid": g.uuid,
                    "index": g.index,
                    "model": g.name,
                    "memory_mib": g.memory_total_mib,
                    "lost": g.lost,
                }
                for g in self._gpus
            ],
        }

    # --- collection ----------------------------------------------------------------------------

    def collect(self, now: float) -> list[Record]:
        if self.available is False and self._retry_at is not None and now >= self._retry_at:
            self.available = None
        attempted = self.available is None
        if not self.start():
            if attempted:
                self._retry_at = now + self.retry_after_s
            return []
        out: list[Record] = []
        for rec in self._pending:
            rec["ts"] = now
            out.append(rec)
        self._pending.clear()
        try:
            self._drain_events(now, out)
        except Exception as exc:  # never let one bad interval stop the agent
            log.exception("NVML event drain failed")
            out.append(self._error_event(now, None, "events", repr(exc)))
        pid_gpus: dict[int, list[GpuRef]] = {}
        for gpu in self._gpus:
            if gpu.lost:
                continue
            try:
                self._collect_gpu(gpu, now, out, pid_gpus)
            except Exception as exc:
                log.exception("NVML collection failed for GPU %s", gpu.index)
                key = ("collect", -1)
                if key not in gpu.reported:
                    gpu.reported.add(key)
                    out.append(self._error_event(now, gpu, "collect", repr(exc)))
        if self.collect_processes:
            self._pid_gpus = pid_gpus
        return out

    def _collect_gpu(
        self, gpu: _Gpu, now: float, out: list[Record], pid_gpus: dict[int, list[GpuRef]]
    ) -> None:
        nv = self.nvml
        h = gpu.handle

        def emit(name: str, value: float | int | None) -> None:
            if value is not None:
                out.append(self._sample(now, gpu, name, value))

        util = self._read(gpu, now, out, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
        if gpu.lost:
            return
        if util is not None:
            emit(signals.DCGM_FI_DEV_GPU_UTIL, int(util.gpu))
        mem = self._read(gpu, now, out, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            emit(signals.DCGM_FI_DEV_FB_USED, int(mem.used) / MIB)
            emit(signals.DCGM_FI_DEV_FB_FREE, int(mem.free) / MIB)
        power_mw = self._read(gpu, now, out, "power", nv.nvmlDeviceGetPowerUsage, h)
        if power_mw is not None:
            emit(signals.DCGM_FI_DEV_POWER_USAGE, int(power_mw) / 1000.0)
        emit(
            signals.DCGM_FI_DEV_GPU_TEMP,
            self._read(
                gpu,
                now,
                out,
                "temperature",
                nv.nvmlDeviceGetTemperature,
                h,
                nv.NVML_TEMPERATURE_GPU,
            ),
        )
        emit(signals.DCGM_FI_DEV_MEMORY_TEMP, self._memory_temp(gpu, now, out))
        emit(
            signals.DCGM_FI_DEV_SM_CLOCK,
            self._read(gpu, now, out, "sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
        )
        emit(signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, self._throttle(gpu, now, out))
        emit(
            signals.DCGM_FI_DEV_PCIE_LINK_GEN,
            self._read(gpu, now, out, "pcie_gen", nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
        )
        emit(
            signals.DCGM_FI_DEV_PCIE_LINK_WIDTH,
            self._read(gpu, now, out, "pcie_width", nv.nvmlDeviceGetCurrPcieLinkWidth, h),
        )
        emit(
            signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER,
            self._read(gpu, now, out, "pcie_replay", nv.nvmlDeviceGetPcieReplayCounter, h),
        )
        self._ecc(gpu, now, out, emit)
        rows = self._read(gpu, now, out, "remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            correctable, uncorrectable, pending, failure = (int(x) for x in rows)
            emit(signals.DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, correctable)
            emit(signals.DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, uncorrectable)
            emit(signals.DCGM_FI_DEV_ROW_REMAP_PENDING, pending)
            emit(signals.DCGM_FI_DEV_ROW_REMAP_FAILURE, failure)
        per_link: list[tuple[int, int]] = []
        crc_total = self._nvlink_crc(gpu, now, out, per_link)
        emit(signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, crc_total)
        if len(per_link) > 1:  # per link only where there is more than the total to say
            for link, value in per_link:
                emit(_NVLINK_CRC_LINK.format(link), value)
        if self.collect_processes and not gpu.lost:
            procs = self._read(
                gpu, now, out, "processes", nv.nvmlDeviceGetComputeRunningProcesses, h
            )
            for proc in procs or ():
                pid_gpus.setdefault(int(proc.pid), []).append(GpuRef(gpu.uuid, gpu.index))

    def _ecc(self, gpu: _Gpu, now: float, out: list[Record], emit: Callable[..., None]) -> None:
        nv = self.nvml
        h = gpu.handle
        corrected, uncorrected = (
            nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        )
        volatile, aggregate = nv.NVML_VOLATILE_ECC, nv.NVML_AGGREGATE_ECC
        read = nv.nvmlDeviceGetTotalEccErrors
        sbe_vol = self._read(gpu, now, out, "ecc_sbe_volatile", read, h, corrected, volatile)
        emit(signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, sbe_vol)
        dbe_vol = self._read(gpu, now, out, "ecc_dbe_volatile", read, h, uncorrected, volatile)
        emit(signals.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, dbe_vol)
        emit(
            signals.DCGM_FI_DEV_ECC_SBE_AGG_TOTAL,
            self._read(gpu, now, out, "ecc_sbe_aggregate", read, h, corrected, aggregate),
        )
        emit(
            signals.DCGM_FI_DEV_ECC_DBE_AGG_TOTAL,
            self._read(gpu, now, out, "ecc_dbe_aggregate", read, h, uncorrected, aggregate),
        )
        if dbe_vol is not None:
            dbe = int(dbe_vol)
            # A rise in the volatile DBE count is an event in its own right (`ecc_dbe`,
            # docs/design.md §5), so the detectors see it even between counter deltas.
            if gpu.last_dbe_volatile is not None and dbe > gpu.last_dbe_volatile:
                out.append(
                    self._event(
                        now,
                        gpu,
                        signals.EVENT_ECC_DBE,
                        dbe - gpu.last_dbe_volatile,
                        f"volatile double-bit ECC count rose to {dbe}",
                    )
                )
            gpu.last_dbe_volatile = dbe

    def _memory_temp(self, gpu: _Gpu, now: float, out: list[Record]) -> float | None:
        """HBM temperature: NVML has it only as a field value (NVML_FI_DEV_MEMORY_TEMP)."""
        nv = self.nvml
        values = self._read(
            gpu,
            now,
            out,
            "memory_temperature",
            nv.nvmlDeviceGetFieldValues,
            gpu.handle,
            [nv.NVML_FI_DEV_MEMORY_TEMP],
        )
        if values is None:
            return None
        fv = values[0]
        ret = int(fv.nvmlReturn)
        if ret != nv.NVML_SUCCESS:
            self._handle_error(gpu, now, out, "memory_temperature", nv.NVMLError(ret))
            return None
        return _field_value(nv, fv)

    def _throttle(self, gpu: _Gpu, now: float, out: list[Record]) -> int | None:
        nv = self.nvml
        # Drivers from 535 call them "clocks event reasons" (same bits); older drivers only have
        # the throttle-reasons entry point, so a missing new function falls back silently.
        newer = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if newer is not None and "throttle_new" not in gpu.disabled and not gpu.lost:
            try:
                return int(newer(gpu.handle))
            except nv.NVMLError as exc:
                if not _is(nv, exc, "NVML_ERROR_FUNCTION_NOT_FOUND"):
                    self._handle_error(gpu, now, out, "throttle_reasons", exc)
                    return None
                gpu.disabled.add("throttle_new")
        value = self._read(
            gpu,
            now,
            out,
            "throttle_reasons",
            nv.nvmlDeviceGetCurrentClocksThrottleReasons,
            gpu.handle,
        )
        return None if value is None else int(value)

    def _nvlink_crc(
        self, gpu: _Gpu, now: float, out: list[Record], per_link: list[tuple[int, int]]
    ) -> int | None:
        """The CRC flit errors summed over the GPU's active links; each link's count is
        appended to `per_link`."""
        nv = self.nvml
        if gpu.nvlinks is None:
            gpu.nvlinks = []
            for link in range(int(nv.NVML_NVLINK_MAX_LINKS)):
                try:
                    state = nv.nvmlDeviceGetNvLinkState(gpu.handle, link)
                except nv.NVMLError as exc:
                    if _is(nv, exc, "NVML_ERROR_GPU_IS_LOST"):
                        self._mark_lost(gpu, now, out, str(exc))
                        return None
                    continue  # link absent (NotSupported / InvalidArgument)
                if int(state) == nv.NVML_FEATURE_ENABLED:
                    gpu.nvlinks.append(link)
        if not gpu.nvlinks or "nvlink_crc" in gpu.disabled:
            return None
        total = 0
        read_any = False
        for link in gpu.nvlinks:
            value = self._read(
                gpu,
                now,
                out,
                "nvlink_crc",
                nv.nvmlDeviceGetNvLinkErrorCounter,
                gpu.handle,
                link,
                nv.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            )
            if gpu.lost or "nvlink_crc" in gpu.disabled:
                return None
            if value is not None:
                total += int(value)
                per_link.append((link, int(value)))
                read_any = True
        return total if read_any else None

    # --- events --------------------------------------------------------------------------------

    def _register_events(self) -> None:
        nv = self.nvml
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            self._pending.append(self._error_event(0.0, None, "events", f"no event set: {exc}"))
            return
        wanted = nv.nvmlEventTypeXidCriticalError
        for gpu in self._gpus:
            try:
                supported = int(nv.nvmlDeviceGetSupportedEventTypes(gpu.handle))
                if supported & wanted:
                    nv.nvmlDeviceRegisterEvents(gpu.handle, wanted, self._event_set)
            except nv.NVMLError as exc:
                if not _is(nv, exc, "NVML_ERROR_NOT_SUPPORTED"):
                    self._pending.append(
                        self._error_event(0.0, gpu, "events", f"XID events not registered: {exc}")
                    )

    def _drain_events(self, now: float, out: list[Record]) -> None:
        nv = self.nvml
        if self._event_set is None:
            return
        for _ in range(MAX_EVENTS_PER_COLLECT):
            try:
                # 0 ms: never blocks the agent's loop; NVML raises Timeout when nothing is queued.
                data = nv.nvmlEventSetWait_v2(self._event_set, 0)
            except nv.NVMLError as exc:
                if _is(nv, exc, "NVML_ERROR_TIMEOUT"):
                    return
                if _is(nv, exc, "NVML_ERROR_GPU_IS_LOST"):
                    # Which GPU is not said; the per-GPU reads below will find it.
                    return
                if not self._event_error_reported:
                    self._event_error_reported = True
                    out.append(self._error_event(now, None, "events", str(exc)))
                return
            if not int(data.eventType) & nv.nvmlEventTypeXidCriticalError:
                continue
            gpu = self._gpu_of_event(data)
            xid = int(data.eventData)
            out.append(self._event(now, gpu, signals.EVENT_XID, xid, f"NVML XID {xid}"))
            if xid == XID_FALLEN_OFF_BUS and gpu is not None:
                self._mark_lost(gpu, now, out, "XID 79: GPU has fallen off the bus")

    def _gpu_of_event(self, data: Any) -> _Gpu | None:
        # By handle first: a GPU that just fell off the bus no longer answers nvmlDeviceGetUUID.
        key = _handle_key(data.device)
        for gpu in self._gpus:
            if _handle_key(gpu.handle) == key:
                return gpu
        nv = self.nvml
        try:
            return self._by_uuid.get(str(nv.nvmlDeviceGetUUID(data.device)))
        except nv.NVMLError:
            return None

    # --- guarded calls ---------------------------------------------------------------------

    def _read(
        self,
        gpu: _Gpu,
        now: float,
        out: list[Record],
        what: str,
        fn: Callable[..., Any],
        *args: Any,
    ) -> Any:
        if what in gpu.disabled or gpu.lost:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            self._handle_error(gpu, now, out, what, exc)
            return None

    def _handle_error(
        self, gpu: _Gpu, now: float, out: list[Record], what: str, exc: Exception
    ) -> None:
        nv = self.nvml
        if _is(nv, exc, "NVML_ERROR_GPU_IS_LOST"):
            self._mark_lost(gpu, now, out, str(exc))
            return
        if _is(nv, exc, "NVML_ERROR_NOT_SUPPORTED"):
            gpu.disabled.add(what)
            return
        permanent = _is(nv, exc, "NVML_ERROR_NO_PERMISSION") or _is(
            nv, exc, "NVML_ERROR_FUNCTION_NOT_FOUND"
        )
        if permanent:
            gpu.disabled.add(what)
        code = int(getattr(exc, "value", -1))
        if (what, code) not in gpu.reported:
            gpu.reported.add((what, code))
            suffix = "; not read again" if permanent else ""
            out.append(self._error_event(now, gpu, what, f"{exc}{suffix}"))

    def _mark_lost(self, gpu: _Gpu, now: float, out: list[Record], why: str) -> None:
        if gpu.lost:
            return
        gpu.lost = True
        log.error("GPU %s (%s) lost: %s", gpu.index, gpu.uuid, why)
        out.append(self._event(now, gpu, signals.EVENT_GPU_LOST, None, why))

    def _static(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    # --- record builders -----------------------------------------------------------------------

    def _sample(self, now: float, gpu: _Gpu, name: str, value: float | int) -> Record:
        return {
            "type": "sample",
            "ts": now,
            "name": name,
            "value": value,
            "node": self.node,
            "gpu": gpu.uuid,
            "gpu_index": gpu.index,
        }

    def _event(
        self, now: float, gpu: _Gpu | None, name: str, value: float | int | None, text: str
    ) -> Record:
        rec: Record = {"type": "event", "ts": now, "name": name, "node": self.node}
        if value is not None:
            rec["value"] = value
        rec["text"] = text
        if gpu is not None:
            rec["gpu"] = gpu.uuid
            rec["gpu_index"] = gpu.index
        return rec

    def _error_event(
        self, now: float, gpu: _Gpu | None, what: str, text: str, gpu_index: int | None = None
    ) -> Record:
        rec = self._event(now, gpu, signals.EVENT_COLLECTOR_ERROR, None, f"nvml {what}: {text}")
        rec["labels"] = {"collector": self.name, "reading": what}
        if gpu is None and gpu_index is not None:
            rec["gpu_index"] = gpu_index
        return rec


# --- helpers -------------------------------------------------------------------------------------


def _is(nv: Any, exc: BaseException, constant: str) -> bool:
    return getattr(exc, "value", None) == getattr(nv, constant, object())


def _handle_key(handle: Any) -> Any:
    """A comparable identity for an NVML device handle: the pointer value of a real
    `c_nvmlDevice_t`, or the (hashable) handle itself for a simulated one."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _cuda_version(value: Any) -> str | None:
    """NVML reports the CUDA driver version as 1000*major + 10*minor (12040 → "12.4")."""
    if value is None:
        return None
    v = int(value)
    return f"{v // 1000}.{(v % 1000) // 10}"


# NVML value type → the member of the c_nvmlValue_t union holding it (else usVal, unsigned short).
_VALUE_MEMBERS = (
    ("NVML_VALUE_TYPE_DOUBLE", "dVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_INT", "uiVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG", "ulVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", "ullVal"),
    ("NVML_VALUE_TYPE_SIGNED_LONG_LONG", "sllVal"),
    ("NVML_VALUE_TYPE_SIGNED_INT", "siVal"),
)


def _field_value(nv: Any, fv: Any) -> float:
    vt = int(fv.valueType)
    member = next((m for name, m in _VALUE_MEMBERS if vt == getattr(nv, name)), "usVal")
    return float(getattr(fv.value, member))


def describe_init_error(nv: Any, exc: BaseException) -> str:
    """Why nvmlInit failed, in words an operator can act on."""
    if _is(nv, exc, "NVML_ERROR_LIBRARY_NOT_FOUND"):
        return "libnvidia-ml.so.1 not found — no NVIDIA driver on this node"
    if _is(nv, exc, "NVML_ERROR_DRIVER_NOT_LOADED"):
        return "the NVIDIA kernel driver is not loaded (is the nvidia module loaded?)"
    if _is(nv, exc, "NVML_ERROR_NO_PERMISSION"):
        return "no permission to open the NVIDIA device files (/dev/nvidia*)"
    if _is(nv, exc, "NVML_ERROR_LIB_RM_VERSION_MISMATCH"):
        return "NVML library and kernel driver versions differ (driver upgraded without reboot?)"
    return f"nvmlInit failed: {exc}"


def load_pynvml() -> Any:
    """The real `pynvml` module (nvidia-ml-py); ImportError when it is not installed."""
    import pynvml  # optional hardware library: absent off GPU nodes, so imported on demand

    return pynvml
