"""The simulated GPU: from what the workload does to what NVML/DCGM would report.

Input: per-GPU activity over time (one column per sample interval, default 1 s) — the fraction
of the interval the graphics engine was busy, SM active / occupancy, tensor-pipe and DRAM
activity (DCGM profiling ratios, 0–1) and framebuffer used — plus a `GpuFaults` describing
what is wrong with each GPU and when. Output: every GPU-scope signal of docs/design.md §4 as
arrays of shape (n_gpus, n_samples), physically tied together:

- power = idle + context overhead + (TDP − idle) · demand · k², where demand is a weighted
  sum of the activity ratios and k the clock ratio; when that would exceed the power limit
  (TDP or an imposed cap) the clock drops until it fits and the SW-power-cap bit (0x4) is set —
  healthy H100s running dense GEMMs do this too, intermittently;
- temperature follows power with thermal inertia (first-order, τ ≈ 25–40 s) above the inlet
  temperature; HBM runs a few degrees above the die;
- the SM clock is 1980 MHz when a context is active (345 MHz with none), in 15 MHz steps,
  reduced by power limiting and by fault clock caps (HW slowdown / thermal);
- the PCIe link trains down to gen 1 while the GPU idles (as real GPUs do to save power) and
  back to its maximum under load; a fault can cap generation/width;
- cumulative counters (ECC, remaps, NVLink CRC, PCIe replays) start at a per-GPU pre-existing
  value and only ever grow, by the fault-driven rates and discrete increments.

`compute_speed()` gives the clock ratio a compute phase runs at for a given power demand, so the
workload model can make a throttled GPU genuinely slower before its activity is integrated.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from contract import signals

# Weights of the DCGM ratios in the dynamic-power demand; a dense bf16 training step
# (engine 1.0, SM 0.9, tensor 0.6, DRAM 0.4) comes out near 0.9 of (TDP − idle).
_W_ENGINE = 0.08
_W_SM = 0.25
_W_TENSOR = 0.85
_W_DRAM = 0.20
_CLOCK_STEP_MHZ = 15
_PCIE_GT_PER_LANE = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0}
_IDLE_LINK_DOWNSHIFT_S = 3  # seconds without engine activity before the link trains down


@dataclass(frozen=True)
class GpuSpec:
    """Static properties of a GPU model. Defaults: H100 SXM5 80 GB (HBM3)."""

    name: str = "NVIDIA H100 80GB HBM3"
    fb_total_mib: int = 81559
    fb_reserved_mib: int = 551
    tdp_w: float = 700.0
    min_power_limit_w: float = 200.0
    idle_w: float = 70.0
    context_w: float = 45.0  # a CUDA context keeps clocks up: ~115 W with nothing running
    sm_clock_max_mhz: int = 1980
    sm_clock_idle_mhz: int = 345
    pcie_gen: int = 5
    pcie_width: int = 16
    nvlinks: int = 18
    slowdown_temp_c: float = 87.0
    shutdown_temp_c: float = 92.0
    bf16_flops: float = 989e12  # dense peak, for MFU

    @property
    def fb_usable_mib(self) -> int:
        return self.fb_total_mib - self.fb_reserved_mib

    def pcie_bandwidth_ratio(self, gen: np.ndarray, width: np.ndarray) -> np.ndarray:
        """Link bandwidth relative to this GPU's full gen×width."""
        gt = np.vectorize(_PCIE_GT_PER_LANE.__getitem__, otypes=[float])(gen)
        ratio: np.ndarray = (gt * width) / (_PCIE_GT_PER_LANE[self.pcie_gen] * self.pcie_width)
        return ratio


H100_SXM = GpuSpec()
H200_SXM = GpuSpec(name="NVIDIA H200", fb_total_mib=143771, idle_w=75.0)
A100_SXM = GpuSpec(
    name="NVIDIA A100-SXM4-80GB",
    fb_total_mib=81920,
    fb_reserved_mib=560,
    tdp_w=400.0,
    min_power_limit_w=100.0,
    idle_w=55.0,
    context_w=26.0,
    sm_clock_max_mhz=1410,
    sm_clock_idle_mhz=210,
    pcie_gen=4,
    nvlinks=12,
    slowdown_temp_c=85.0,
    bf16_flops=312e12,
)
GPU_MODELS: tuple[GpuSpec, ...] = (H100_SXM, H200_SXM, A100_SXM)


def spec_named(name: str) -> GpuSpec:
    """The spec whose `name` (what NVML reports, and `meta.gpu_model`) is `name`."""
    for spec in GPU_MODELS:
        if spec.name == name:
            return spec
    raise KeyError(f"unknown GPU model {name!r}; known: {[s.name for s in GPU_MODELS]}")


def gpu_uuid(seed: int, node: str, gpu_index: int) -> str:
    """A deterministic NVML-style UUID: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = hashlib.sha256(f"{seed}/{node}/{gpu_index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass
class GpuActivity:
    """What the workload did on each GPU, averaged per sample interval; shape (n_gpus, n)."""

    engine_active: np.ndarray
    sm_active: np.ndarray
    sm_occupancy: np.ndarray
    tensor_active: np.ndarray
    dram_active: np.ndarray
    fb_used_mib: np.ndarray

    @classmethod
    def idle(cls, n_gpus: int, n_samples: int) -> GpuActivity:
        z = np.zeros((n_gpus, n_samples))
        return cls(z.copy(), z.copy(), z.copy(), z.copy(), z.copy(), z.copy())

    @property
    def shape(self) -> tuple[int, int]:
        return self.engine_active.shape


GPU_COUNTER_SIGNALS: tuple[str, ...] = signals.GPU_ERROR_COUNTERS


@dataclass
class GpuFaults:
    """What is wrong with which GPU, and when (sample indices, half-open [start, end)).

    Rates are expected events per second (drawn Poisson per sample); `bump` adds a discrete
    increment at one sample. Every counter starts at its `preexisting` value.
    """

    n_gpus: int
    n_samples: int
    clock_cap_mhz: np.ndarray = field(init=False)
    power_cap_w: np.ndarray = field(init=False)
    extra_bits: np.ndarray = field(init=False)
    thermal_offset_c: np.ndarray = field(init=False)
    pcie_gen_max: np.ndarray = field(init=False)
    pcie_width: np.ndarray = field(init=False)
    rates: dict[str, np.ndarray] = field(init=False, default_factory=dict)
    bumps: dict[str, np.ndarray] = field(init=False, default_factory=dict)
    preexisting: dict[str, np.ndarray] = field(init=False, default_factory=dict)
    lost_from: np.ndarray = field(init=False)  # sample index the GPU stops answering; n = never

    def __post_init__(self) -> None:
        shape = (self.n_gpus, self.n_samples)
        self.clock_cap_mhz = np.full(shape, np.inf)
        self.power_cap_w = np.full(shape, np.inf)
        self.extra_bits = np.zeros(shape, dtype=np.int64)
        self.thermal_offset_c = np.zeros(shape)
        self.pcie_gen_max = np.full(shape, 99, dtype=np.int64)
        self.pcie_width = np.full(shape, 99, dtype=np.int64)
        self.lost_from = np.full(self.n_gpus, self.n_samples, dtype=np.int64)

    def _span(self, start: int, end: int | None) -> slice:
        return slice(max(0, start), self.n_samples if end is None else min(end, self.n_samples))

    def throttle(
        self, gpu: int, start: int, end: int | None, *, bits: int, clock_mhz: float
    ) -> None:
        """Clock held at or below `clock_mhz` with throttle-reason `bits` (e.g. 0x8 HW slowdown)."""
        s = self._span(start, end)
        self.clock_cap_mhz[gpu, s] = np.minimum(self.clock_cap_mhz[gpu, s], clock_mhz)
        self.extra_bits[gpu, s] |= bits

    def thermal(self, gpu: int, start: int, end: int | None, offset_c: float) -> None:
        """Cooling worse by `offset_c` (failing fan, blocked inlet)."""
        self.thermal_offset_c[gpu, self._span(start, end)] += offset_c

    def power_cap(self, gpu: int, start: int, end: int | None, watts: float) -> None:
        s = self._span(start, end)
        self.power_cap_w[gpu, s] = np.minimum(self.power_cap_w[gpu, s], watts)

    def pcie_downgrade(
        self, gpu: int, start: int, end: int | None, *, gen: int, width: int, replays_per_s: float
    ) -> None:
        s = self._span(start, end)
        self.pcie_gen_max[gpu, s] = gen
        self.pcie_width[gpu, s] = width
        self.rate(signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER, gpu, start, end, replays_per_s)

    def rate(self, counter: str, gpu: int, start: int, end: int | None, per_s: float) -> None:
        arr = self.rates.setdefault(counter, np.zeros((self.n_gpus, self.n_samples)))
        arr[gpu, self._span(start, end)] += per_s

    def rate_profile(self, counter: str, gpu: int, per_s: np.ndarray) -> None:
        """A time-varying rate (one value per sample), e.g. an accelerating SBE rate."""
        arr = self.rates.setdefault(counter, np.zeros((self.n_gpus, self.n_samples)))
        arr[gpu] += per_s

    def bump(self, counter: str, gpu: int, at: int, amount: int = 1) -> None:
        if 0 <= at < self.n_samples:
            arr = self.bumps.setdefault(
                counter, np.zeros((self.n_gpus, self.n_samples), dtype=np.int64)
            )
            arr[gpu, at] += amount

    def set_preexisting(self, counter: str, gpu: int, value: int) -> None:
        arr = self.preexisting.setdefault(counter, np.zeros(self.n_gpus, dtype=np.int64))
        arr[gpu] = value

    def lose(self, gpu: int, at: int) -> None:
        """The GPU falls off the bus at sample `at`: no readings from then on."""
        self.lost_from[gpu] = min(self.lost_from[gpu], max(0, at))

    def pcie_link(self, spec: GpuSpec) -> tuple[np.ndarray, np.ndarray]:
        """(gen, width) the link trains to under load."""
        return (
            np.minimum(self.pcie_gen_max, spec.pcie_gen),
            np.minimum(self.pcie_width, spec.pcie_width),
        )


def _power_limited_ratio(
    spec: GpuSpec, demand: np.ndarray, limit_w: np.ndarray, context: np.ndarray
) -> np.ndarray:
    """Largest clock ratio k with idle + ctx + (TDP − idle)·demand·k² ≤ limit."""
    headroom = limit_w - spec.idle_w - spec.context_w * context
    dyn = (spec.tdp_w - spec.idle_w) * np.maximum(demand, 1e-9)
    ratio: np.ndarray = np.sqrt(np.clip(headroom, 1.0, None) / dyn)
    return ratio


def compute_speed(spec: GpuSpec, faults: GpuFaults, demand: float) -> np.ndarray:
    """Clock ratio (0–1] a compute phase of power `demand` runs at, per GPU and sample."""
    limit = np.minimum(faults.power_cap_w, spec.tdp_w)
    k_pow = _power_limited_ratio(spec, np.full(limit.shape, demand), limit, np.ones(limit.shape))
    k_cap = faults.clock_cap_mhz / spec.sm_clock_max_mhz
    speed: np.ndarray = np.minimum(1.0, np.minimum(k_pow, k_cap))
    return speed


@dataclass
class GpuEnvironment:
    """Per-GPU physical constants that differ between otherwise identical boards."""

    inlet_c: np.ndarray  # inlet/ambient air temperature
    thermal_r: np.ndarray  # °C per W above inlet at steady state
    thermal_tau_s: np.ndarray
    idle_w: np.ndarray
    mem_offset_c: np.ndarray

    @classmethod
    def draw(cls, rng: np.random.Generator, n_gpus: int, spec: GpuSpec) -> GpuEnvironment:
        return cls(
            inlet_c=rng.uniform(22.0, 30.0, n_gpus),
            thermal_r=rng.uniform(0.060, 0.078, n_gpus),
            thermal_tau_s=rng.uniform(25.0, 40.0, n_gpus),
            idle_w=spec.idle_w * rng.uniform(0.92, 1.08, n_gpus),
            mem_offset_c=rng.uniform(4.0, 9.0, n_gpus),
        )


def _noisy_ratio(rng: np.random.Generator, x: np.ndarray, sd: float) -> np.ndarray:
    """DCGM sampling noise; exactly 0 stays 0 (an idle GPU reads 0)."""
    noise = rng.normal(0.0, sd, x.shape)
    return np.where(x > 0, np.clip(x + noise * np.sqrt(np.clip(x, 0.05, 1.0)), 0.0, 1.0), 0.0)


def simulate_gpus(
    activity: GpuActivity,
    faults: GpuFaults,
    rng: np.random.Generator,
    *,
    spec: GpuSpec = H100_SXM,
    env: GpuEnvironment | None = None,
    interval_s: float = 1.0,
) -> dict[str, np.ndarray]:
    """Every GPU-scope signal of docs/design.md §4, shape (n_gpus, n_samples).

    Float arrays for gauges; int64 arrays for counters, clocks, temperatures, bitmask, PCIe,
    utilisation and FB. Samples at and after `faults.lost_from[g]` are NaN in the float arrays
    and -1 in the integer arrays (the GPU stopped answering; writers skip them).
    """
    n_gpus, n = activity.shape
    if (faults.n_gpus, faults.n_samples) != (n_gpus, n):
        raise ValueError(
            f"faults cover {(faults.n_gpus, faults.n_samples)}, activity {(n_gpus, n)}"
        )
    env = env or GpuEnvironment.draw(rng, n_gpus, spec)

    engine = _noisy_ratio(rng, np.clip(activity.engine_active, 0, 1), 0.006)
    sm = np.minimum(_noisy_ratio(rng, np.clip(activity.sm_active, 0, 1), 0.012), engine)
    occupancy = np.minimum(_noisy_ratio(rng, np.clip(activity.sm_occupancy, 0, 1), 0.01), sm)
    tensor = np.minimum(_noisy_ratio(rng, np.clip(activity.tensor_active, 0, 1), 0.012), sm)
    dram = _noisy_ratio(rng, np.clip(activity.dram_active, 0, 1), 0.01)
    context = (activity.fb_used_mib > 0).astype(float)

    # Clock and power.
    demand = _W_ENGINE * engine + _W_SM * sm + _W_TENSOR * tensor + _W_DRAM * dram
    limit = np.minimum(faults.power_cap_w, spec.tdp_w)
    k_pow = _power_limited_ratio(spec, demand, limit, context)
    k_cap = faults.clock_cap_mhz / spec.sm_clock_max_mhz
    k = np.minimum(1.0, np.minimum(k_pow, k_cap))
    power_limited = (k_pow < np.minimum(1.0, k_cap)) & (engine > 0)
    idle_ratio = spec.sm_clock_idle_mhz / spec.sm_clock_max_mhz
    clock_ratio = np.where((context > 0) | (engine > 0), k, idle_ratio)
    clock = (
        np.round(clock_ratio * spec.sm_clock_max_mhz / _CLOCK_STEP_MHZ) * _CLOCK_STEP_MHZ
    ).astype(np.int64)

    power = (
        env.idle_w[:, None]
        + spec.context_w * context
        + (spec.tdp_w - spec.idle_w) * demand * k**2
        + rng.normal(0.0, 2.5, (n_gpus, n))
    )
    # A power-limited GPU hovers just under its limit.
    power = np.where(power_limited, limit - np.abs(rng.normal(0.0, 4.0, (n_gpus, n))), power)
    power = np.clip(power, 0.9 * env.idle_w[:, None], limit)

    bits = faults.extra_bits | np.where(power_limited, signals.THROTTLE_SW_POWER_CAP, 0)
    bits = np.where(engine > 0, bits, faults.extra_bits & ~signals.THROTTLE_SW_POWER_CAP)

    # Temperature with inertia (first-order lag toward the steady state).
    steady = env.inlet_c[:, None] + env.thermal_r[:, None] * power + faults.thermal_offset_c
    alpha = 1.0 - np.exp(-interval_s / env.thermal_tau_s)
    temp = np.empty_like(steady)
    t_now = steady[:, 0].copy()
    for i in range(n):
        t_now += alpha * (steady[:, i] - t_now)
        temp[:, i] = t_now
    gpu_temp = np.round(temp + rng.normal(0.0, 0.35, temp.shape)).astype(np.int64)
    mem_temp = np.round(
        temp * 0.92 + env.mem_offset_c[:, None] + 2.0 + rng.normal(0.0, 0.35, temp.shape)
    ).astype(np.int64)

    # PCIe link: full speed (or the fault cap) under load, gen 1 after a few idle seconds.
    gen_load, width = faults.pcie_link(spec)
    busy = engine > 0
    recent = np.zeros_like(busy)
    for lag in range(_IDLE_LINK_DOWNSHIFT_S):
        recent[:, lag:] |= busy[:, : n - lag]
    pcie_gen = np.where(recent, gen_load, 1).astype(np.int64)

    util = np.round(
        100.0 * np.clip(np.where(engine > 0, engine + rng.normal(0.0, 0.01, engine.shape), 0), 0, 1)
    ).astype(np.int64)
    fb_used = np.round(np.clip(activity.fb_used_mib, 0, spec.fb_total_mib - spec.fb_reserved_mib))
    fb_used = fb_used.astype(np.int64)
    fb_free = spec.fb_total_mib - spec.fb_reserved_mib - fb_used

    out: dict[str, np.ndarray] = {
        signals.DCGM_FI_DEV_GPU_UTIL: util,
        signals.DCGM_FI_PROF_GR_ENGINE_ACTIVE: engine,
        signals.DCGM_FI_PROF_SM_ACTIVE: sm,
        signals.DCGM_FI_PROF_SM_OCCUPANCY: occupancy,
        signals.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: tensor,
        signals.DCGM_FI_PROF_DRAM_ACTIVE: dram,
        signals.DCGM_FI_DEV_FB_USED: fb_used,
        signals.DCGM_FI_DEV_FB_FREE: fb_free,
        signals.DCGM_FI_DEV_POWER_USAGE: power,
        signals.DCGM_FI_DEV_GPU_TEMP: gpu_temp,
        signals.DCGM_FI_DEV_MEMORY_TEMP: mem_temp,
        signals.DCGM_FI_DEV_SM_CLOCK: clock,
        signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: bits.astype(np.int64),
        signals.DCGM_FI_DEV_PCIE_LINK_GEN: pcie_gen,
        signals.DCGM_FI_DEV_PCIE_LINK_WIDTH: width.astype(np.int64),
    }
    for name in GPU_COUNTER_SIGNALS:
        total = np.zeros((n_gpus, n), dtype=np.int64)
        rate = faults.rates.get(name)
        if rate is not None:
            total += rng.poisson(np.clip(rate, 0, None) * interval_s)
        bump = faults.bumps.get(name)
        if bump is not None:
            total += bump
        base = faults.preexisting.get(name, np.zeros(n_gpus, dtype=np.int64))
        out[name] = base[:, None] + np.cumsum(total, axis=1)

    lost = np.arange(n)[None, :] >= faults.lost_from[:, None]
    if lost.any():
        for arr in out.values():
            if arr.dtype.kind == "f":
                arr[lost] = np.nan
            else:
                arr[lost] = -1
    return out


def round_ratio(x: np.ndarray) -> np.ndarray:
    """Ratios as DCGM prints them (4 decimals keeps traces small and loses nothing real)."""
    return np.round(x, 4)
