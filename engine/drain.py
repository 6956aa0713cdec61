"""Drain advice from the days-ahead forecast (engine/forecast.py): which nodes to drain when,
grouped so that a drain breaks a running multi-node job once, not once per node, and what the
operator loses by waiting a day.

- Each node with a component at drain or urgent must be out of service before its earliest
  estimated failure, less a margin (`DRAIN_MARGIN_H`), at the latest.
- Nodes that share a running job are drained together, at the earliest deadline among them:
  the job is interrupted (and restarted from its checkpoint) once.
- If every job on a group ends before its deadline, the advice is to drain when they end.
- Waiting a day costs, in expectation, the risk of failing within a day times the GPU-hours a
  failure under the job throws away (RESTART_COST_H of every GPU of the job: the work since
  its last checkpoint plus the restart), which the drain would have saved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Drain this long before the earliest estimated failure.
DRAIN_MARGIN_H = 12.0
# GPU-hours a job loses per GPU when a failure interrupts it: the work since the last
# checkpoint (half a typical 1–2 h checkpoint interval) plus requeue and restart (~0.5 h).
RESTART_COST_H = 1.5


@dataclass(frozen=True)
class NodeRisk:
    node: str
    components: tuple[str, ...]  # "kind:key" of each flagged component
    ttf_hours: float | None  # earliest estimated failure among them
    risk_1d: float


@dataclass(frozen=True)
class Job:
    job_id: str
    nodes: tuple[str, ...]
    gpus: int
    ends_in_hours: float | None = None  # None when unknown


@dataclass
class DrainGroup:
    nodes: list[str]
    components: list[str]
    drain_in_hours: float  # from now; 0 = now
    jobs: list[str]
    reason: str
    wait_cost_gpu_hours: float  # expected GPU-hours lost by waiting 24 h more
    after_jobs_end: bool = False
    node_ttf_hours: dict[str, float | None] = field(default_factory=dict)


def plan_drains(nodes: list[NodeRisk], jobs: list[Job]) -> list[DrainGroup]:
    """Groups of nodes to drain, soonest first."""
    flagged = {n.node: n for n in nodes}
    parent = {name: name for name in flagged}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for job in jobs:
        hit = [n for n in job.nodes if n in flagged]
        for other in hit[1:]:
            parent[find(other)] = find(hit[0])
    groups: dict[str, list[str]] = {}
    for name in flagged:
        groups.setdefault(find(name), []).append(name)
    out = []
    for members in groups.values():
        members.sort()
        ttfs: list[float] = [t for m in members if (t := flagged[m].ttf_hours) is not None]
        deadline = max(0.0, min(ttfs) - DRAIN_MARGIN_H) if ttfs else 0.0
        on = [j for j in jobs if set(j.nodes) & set(members)]
        ends = [j.ends_in_hours for j in on]
        after = bool(on) and all(e is not None and e <= deadline for e in ends)
        when = max((e for e in ends if e is not None), default=deadline) if after else deadline
        risk_1d = max(flagged[m].risk_1d for m in members)
        gpus = sum(j.gpus for j in on)
        cost = round(risk_1d * gpus * RESTART_COST_H, 1)
        comps = [c for m in members for c in flagged[m].components]
        if after:
            reason = (
                f"drain when {', '.join(j.job_id for j in on)} end(s) in {when:.0f} h, "
                f"before the earliest estimated failure in {min(ttfs):.0f} h"
            )
        elif on:
            reason = (
                f"drain together in {when:.0f} h: one interruption of "
                f"{', '.join(j.job_id for j in on)} instead of one per node"
            )
        else:
            reason = (
                f"no job running: drain in {when:.0f} h" if when else "no job running: drain now"
            )
        out.append(
            DrainGroup(
                nodes=members,
                components=comps,
                drain_in_hours=round(when, 1),
                jobs=[j.job_id for j in on],
                reason=reason,
                wait_cost_gpu_hours=cost,
                after_jobs_end=after,
                node_ttf_hours={m: flagged[m].ttf_hours for m in members},
            )
        )
    out.sort(key=lambda g: (g.drain_in_hours, g.nodes))
    return out
