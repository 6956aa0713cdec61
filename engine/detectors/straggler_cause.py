"""The slow rank's cause (`slow_rank`): its GPU's throttle reasons, SM clock and power, PCIe
link and link-error counters against the job's other GPUs; split from stragglers.py, which
decides whether a rank is a straggler at all."""

from __future__ import annotations

import numpy as np

from contract import signals
from engine.detectors.common import counter_delta
from engine.findings import Finding
from engine.window import JobWindow

HW_THROTTLE = (
    signals.THROTTLE_HW_SLOWDOWN | signals.THROTTLE_HW_THERMAL | signals.THROTTLE_HW_POWER_BRAKE
)


def slow_rank_cause(
    w: JobWindow, row: int, a: float, b: float, f: Finding
) -> tuple[str, list[str]]:
    """The slow rank's cause from its GPU's signals against the other ranks' GPUs."""
    sel = (w.times >= a) & (w.times <= b)
    others = [i for i in range(w.world) if i != row]
    r = w.ranks[row]
    cites: list[str] = []
    bits = w.gpu.get(signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)
    clock = w.gpu.get(signals.DCGM_FI_DEV_SM_CLOCK)
    power = w.gpu.get(signals.DCGM_FI_DEV_POWER_USAGE)
    gen = w.gpu.get(signals.DCGM_FI_DEV_PCIE_LINK_GEN)
    width = w.gpu.get(signals.DCGM_FI_DEV_PCIE_LINK_WIDTH)

    def med(arr: np.ndarray | None, rows: list[int] | int) -> float:
        if arr is None:
            return float("nan")
        v = arr[rows][..., sel] if isinstance(rows, list) else arr[rows, sel]
        v = v[np.isfinite(v)]
        return float(np.median(v)) if len(v) else float("nan")

    def ev(signal: str, observed: float | str, baseline: float | str | None, note: str) -> str:
        return f.add(
            signal, (a, b), observed, baseline, note, node=r.node, gpu=r.gpu, rank=r.rank, job=w.job
        )

    cause = "unknown"
    if bits is not None:
        b_r = bits[row, sel]
        b_r = b_r[np.isfinite(b_r)].astype(np.int64)
        if len(b_r):
            hw = float(np.mean((b_r & HW_THROTTLE) != 0))
            thermal = float(np.mean((b_r & signals.THROTTLE_SW_THERMAL) != 0))
            pcap = float(np.mean((b_r & signals.THROTTLE_SW_POWER_CAP) != 0))
            b_o = bits[others][:, sel]
            b_o = b_o[np.isfinite(b_o)].astype(np.int64)
            hw_o = float(np.mean((b_o & HW_THROTTLE) != 0)) if len(b_o) else 0.0
            # Throttling explains the slowness when it covers half the slow period and the other
            # ranks' GPUs are not throttled the same way (a hot aisle throttles everyone).
            if max(hw, thermal) >= 0.5 and hw_o < 0.25:
                reasons = sorted(
                    {
                        name
                        for bit, name in signals.THROTTLE_REASON_NAMES.items()
                        if (np.bitwise_or.reduce(b_r) & bit)
                    }
                )
                cites.append(
                    ev(
                        signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,
                        round(max(hw, thermal), 3),
                        round(hw_o, 3),
                        "share of samples with clock throttling ("
                        + ", ".join(reasons)
                        + ") on this GPU; baseline: the job's other GPUs",
                    )
                )
                cause = "clock_throttle"
            elif pcap >= 0.5:
                cites.append(
                    ev(
                        signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,
                        round(pcap, 3),
                        None,
                        "share of samples held by the software power cap",
                    )
                )
                cause = "power_cap"
    c_r, c_o = med(clock, row), med(clock, others)
    p_r, p_o = med(power, row), med(power, others)
    if cause == "unknown" and np.isfinite(c_r) and np.isfinite(c_o) and c_r < 0.95 * c_o:
        # A lower clock with lower power than its peers while computing more: power limited.
        if np.isfinite(p_r) and np.isfinite(p_o) and p_r < 0.9 * p_o:
            cause = "power_cap"
            cites.append(
                ev(
                    signals.DCGM_FI_DEV_POWER_USAGE,
                    round(p_r, 1),
                    round(p_o, 1),
                    "median power draw of this GPU vs the job's other GPUs (W)",
                )
            )
        else:
            cause = "clock_throttle"
    if cause != "unknown" and np.isfinite(c_r):
        cites.append(
            ev(
                signals.DCGM_FI_DEV_SM_CLOCK,
                round(c_r, 1),
                round(c_o, 1),
                "median SM clock of this GPU vs the job's other GPUs (MHz)",
            )
        )
    if cause == "unknown" and gen is not None and width is not None:
        # Idle links train down to save power: compare only while the job computes.
        g_r, g_o = med(gen, row), med(gen, others)
        w_r, w_o = med(width, row), med(width, others)
        if (np.isfinite(g_r) and g_r < g_o) or (np.isfinite(w_r) and w_r < w_o):
            cause = "pcie"
            cites.append(
                ev(
                    signals.DCGM_FI_DEV_PCIE_LINK_GEN,
                    f"gen{g_r:.0f} x{w_r:.0f}",
                    f"gen{g_o:.0f} x{w_o:.0f}",
                    "PCIe link of this GPU vs the job's other GPUs",
                )
            )
    raw = w.gpu_raw.get(r.gpu, {})
    for counter, name in (
        (signals.DCGM_FI_DEV_PCIE_REPLAY_COUNTER, "pcie"),
        (signals.DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, "nvlink"),
    ):
        s = raw.get(counter)
        if s is None:
            continue
        keep = (s.ts >= a) & (s.ts <= b)
        d, v0, _ = counter_delta(s.ts[keep], s.values[keep])
        peers = []
        for i in others:
            ps = w.gpu_raw.get(w.ranks[i].gpu, {}).get(counter)
            if ps is not None:
                k2 = (ps.ts >= a) & (ps.ts <= b)
                peers.append(counter_delta(ps.ts[k2], ps.values[k2])[0])
        peer = float(np.median(peers)) if peers else 0.0
        # Link errors implicate the GPU when they rise here and (almost) nowhere else.
        if d >= 10 and d > 10 * max(peer, 1.0):
            if cause in ("unknown", name):
                cause = name
            cites.append(
                ev(
                    counter,
                    d,
                    peer,
                    f"increase over the slow period (pre-existing value "
                    f"{v0:.0f}); baseline: median increase on the job's other GPUs",
                )
            )
    return cause, cites


CAUSE_TEXT = {
    "clock_throttle": "its GPU's clocks are throttled",
    "power_cap": "its GPU is power-limited below its peers",
    "pcie": "its GPU's PCIe link is degraded (downgraded link and/or replays)",
    "nvlink": "its GPU's NVLink is taking errors (CRC flit errors rising)",
    "unknown": "no throttle, power, PCIe or NVLink anomaly was visible on its GPU",
}
CAUSE_TITLE = {
    "clock_throttle": "clock throttling",
    "power_cap": "power limited",
    "pcie": "PCIe link degraded",
    "nvlink": "NVLink errors",
}
CAUSE_FIX = {
    "clock_throttle": "check cooling and power delivery of that GPU (fans, inlet temperature, "
    "power brake), then reset or replace it",
    "power_cap": "restore the GPU's power limit (nvidia-smi -pl) or check the PSU/power brake",
    "pcie": "reseat the GPU or riser and check the slot; the link should train at full "
    "generation and width",
    "nvlink": "run NVLink diagnostics (dcgmi diag) and replace the GPU or NVSwitch tray",
    "unknown": "run node diagnostics (dcgmi diag -r 3) on that GPU",
}
