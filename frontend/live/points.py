"""New chart points for open job pages, from the batch ingest just stored (no query).

The job page draws the GPU signals of `frontend.selectors.job_detail.GPU_SIGNALS`, one chart
per signal (`job-gpu-<key>`), one line per rank labelled "rank <n>". A points message carries,
per job of the batch, the newest sample of each charted signal of each rank, scaled as the page
scales it:

    {"type": "points", "job": "<job id>", "t": <unix seconds of the newest sample>,
     "charts": {"job-gpu-sm": {"rank 0": 87.5, "rank 1": 12.0}, ...}}

and the page appends one point at `t` to each line it draws (null for a rank the message does
not carry; a "median of N ranks" line takes the median of the ranks it does carry).

At most one message per job every POINTS_INTERVAL_S: a job's batches (one per node every few
seconds) are merged into the job's pending points in memory and the merged newest values go out
when the interval has passed. A sample that needs the series' rank and job to be drawn
(the agent's identity join gives GPU samples both) is skipped without them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from frontend.selectors.job_detail import GPU_SIGNALS

POINTS_INTERVAL_S = 2.0
# The pending points of this many jobs at most (a job that ended leaves its entry behind;
# the oldest are dropped past this).
MAX_TRACKED_JOBS = 20_000

_CHARTS = {sig.name: (f"job-gpu-{sig.key}", sig.scale) for sig in GPU_SIGNALS}


@dataclass
class _Pending:
    sent_at: float = 0.0
    t: float = 0.0
    charts: dict[str, dict[str, float]] = field(default_factory=dict)


def newest_points(batch: Any) -> dict[str, tuple[float, dict[str, dict[str, float]]]]:
    """job id → (newest sample time, chart id → line label → value) of one stored batch."""
    out: dict[str, tuple[float, dict[str, dict[str, float]]]] = {}
    counts = np.asarray(batch.counts, dtype=np.int64)
    if not len(counts):
        return out
    ends = np.cumsum(counts)
    ts_ms = np.asarray(batch.ts_ms)
    values = np.asarray(batch.values)
    for i, key in enumerate(batch.series):
        chart = _CHARTS.get(key.name)
        if chart is None or not key.job or key.rank is None or counts[i] == 0:
            continue
        lo, hi = int(ends[i] - counts[i]), int(ends[i])
        newest = lo + int(np.argmax(ts_ms[lo:hi]))
        value = float(values[newest])
        if not np.isfinite(value):
            continue
        chart_id, scale = chart
        t = float(ts_ms[newest]) / 1000.0
        t_job, charts = out.get(key.job, (0.0, {}))
        charts.setdefault(chart_id, {})[f"rank {key.rank}"] = round(value * scale, 4)
        out[key.job] = (max(t_job, t), charts)
    return out


class PointsThrottle:
    """Per (operator, job): merge points, release them at most once per interval."""

    def __init__(self, interval_s: float = POINTS_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, str], _Pending] = {}

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()

    def offer(
        self,
        operator_id: int,
        job_id: str,
        t: float,
        charts: dict[str, dict[str, float]],
        now: float | None = None,
    ) -> dict[str, Any] | None:
        """Merge; return the points message to send now, or None (sent too recently)."""
        now = time.monotonic() if now is None else now
        key = (operator_id, job_id)
        with self._lock:
            pending = self._pending.get(key)
            if pending is None:
                if len(self._pending) >= MAX_TRACKED_JOBS:
                    self._pending.pop(next(iter(self._pending)))
                pending = self._pending[key] = _Pending()
            pending.t = max(pending.t, t)
            for chart_id, lines in charts.items():
                pending.charts.setdefault(chart_id, {}).update(lines)
            if now - pending.sent_at < self.interval_s:
                return None
            message = {"type": "points", "job": job_id, "t": pending.t, "charts": pending.charts}
            pending.sent_at = now
            pending.charts = {}
            return message
