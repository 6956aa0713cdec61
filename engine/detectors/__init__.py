"""Detectors: one plain function per docs/design.md §6 family, `JobWindow -> list[Finding]` (or
`GpuWindow` for fleet health). docs/detectors.md describes each and its thresholds.

    findings = run_detectors(window)          # every job family, conflicts resolved
    fleet = run_fleet_health(gpu_window)      # gpu_degrading for one GPU
"""

from __future__ import annotations

from collections.abc import Callable

from engine.detectors.checkpoint import detect_checkpoint_stall
from engine.detectors.common import is_material, state_impact
from engine.detectors.hardware import (
    detect_fabric_degraded,
    detect_gpu_degrading,
    detect_hardware_fault,
)
from engine.detectors.inference import detect_underfilled_batches
from engine.detectors.progress import (
    detect_collective_hang,
    detect_input_starvation,
    detect_no_learning,
    detect_numerical_divergence,
)
from engine.detectors.stragglers import detect_sequence_imbalance, detect_slow_rank
from engine.findings import Finding
from engine.window import GpuWindow, JobWindow

JOB_DETECTORS: dict[str, Callable[[JobWindow], list[Finding]]] = {
    "hardware_fault": detect_hardware_fault,
    "collective_hang": detect_collective_hang,
    "numerical_divergence": detect_numerical_divergence,
    "no_learning": detect_no_learning,
    "checkpoint_stall": detect_checkpoint_stall,
    "slow_rank": detect_slow_rank,
    "sequence_imbalance": detect_sequence_imbalance,
    "fabric_degraded": detect_fabric_degraded,
    "input_starvation": detect_input_starvation,
    "underfilled_batches": detect_underfilled_batches,
}

# When a hardware fault hit the job, what follows (a hang, a divergence, a straggler) is its
# consequence and is not reported as a family of its own.
_CONSEQUENCES_OF_FAULT = {
    "collective_hang",
    "numerical_divergence",
    "slow_rank",
    "sequence_imbalance",
    "input_starvation",
    "no_learning",
}


def run_detectors(window: JobWindow) -> list[Finding]:
    """Every job-level detector on one window, with a fault's consequences folded into it."""
    out: list[Finding] = []
    for fn in JOB_DETECTORS.values():
        out.extend(fn(window))
    # Materiality: a slowdown below the floor set from healthy jitter is no verdict; every
    # slowdown/GPU-time verdict states its impact (docs/detectors.md "Materiality").
    out = [f for f in out if is_material(f)]
    for f in out:
        state_impact(f, window)
    if any(f.family == "hardware_fault" for f in out):
        out = [f for f in out if f.family not in _CONSEQUENCES_OF_FAULT]
    if any(f.family == "input_starvation" for f in out):
        # Ranks waiting on their own input queues take turns at being slowest, or one rank's
        # slower input keeps it last: the input pipeline explains that, not the sampler or the
        # rank's GPU — unless the slow rank's own GPU shows a hardware cause.
        out = [
            f
            for f in out
            if f.family != "sequence_imbalance"
            and not (f.family == "slow_rank" and f.details.get("cause") == "unknown")
        ]
    return out


def run_fleet_health(window: GpuWindow) -> list[Finding]:
    return detect_gpu_degrading(window)


__all__ = [
    "JOB_DETECTORS",
    "detect_checkpoint_stall",
    "detect_collective_hang",
    "detect_fabric_degraded",
    "detect_gpu_degrading",
    "detect_hardware_fault",
    "detect_input_starvation",
    "detect_no_learning",
    "detect_numerical_divergence",
    "detect_sequence_imbalance",
    "detect_slow_rank",
    "detect_underfilled_batches",
    "run_detectors",
    "run_fleet_health",
]
