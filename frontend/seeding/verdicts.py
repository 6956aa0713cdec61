"""Incidents with real verdicts, many times over.

The verdict JSON is never hand-made: each fault scenario of the simulator is played once
through the real detectors (engine.analyze_store over a simulated 15-minute run of one 8-GPU
node), and each seeded incident is one of those verdicts moved onto a seeded job — its job id,
node names and GPU UUIDs replaced by the job's (rank r's GPU for the template's rank r), its
intervals shifted into the job's life, its impact scaled to the job's size and the incident's
length, its confidence varied. Titles, summaries, evidence notes and cleared checks stay the
detectors' own words, so the verdict page renders what it will render in production.

Open incidents obey the live pipeline's uniqueness (one open per job and family, one open per
GPU for gpu_degrading); the rest are resolved, each with its created (and resolved) revision.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from engine.analyze import analyze_store
from engine.store import TraceStore
from frontend.seeding.bulk import ids_of, insert_columns
from frontend.seeding.fleet import FleetSeed
from investigations.models import (
    GPU_DEGRADING,
    Incident,
    IncidentState,
    ResolveReason,
    RevisionKind,
    VerdictRevision,
)
from simulator import simulate
from simulator.scenarios import list_scenarios

TEMPLATE_SECONDS = 900.0
GRACE_S = 600.0  # investigations.services.GRACE_S: how long after its last sighting one resolves


@dataclass(frozen=True)
class Template:
    family: str
    category: str
    text: str  # the verdict as JSON, identities to be replaced
    job: str | None
    nodes: tuple[str, ...]
    gpus: tuple[str, ...]  # in the order their ranks (or first sightings) give
    gpu_rank: dict[str, int]
    start: float
    length: float
    confidence: float


def _walk_identities(value: Any, nodes: list[str], gpus: list[str], ranks: dict[str, int]) -> None:
    if isinstance(value, dict):
        node, gpu, rank = value.get("node"), value.get("gpu"), value.get("rank")
        if isinstance(node, str) and node not in nodes:
            nodes.append(node)
        if isinstance(gpu, str):
            if gpu not in gpus:
                gpus.append(gpu)
            if isinstance(rank, int):
                ranks.setdefault(gpu, rank)
        for item in value.values():
            _walk_identities(item, nodes, gpus, ranks)
    elif isinstance(value, list):
        for item in value:
            _walk_identities(item, nodes, gpus, ranks)


@functools.cache
def verdict_templates(families: tuple[str, ...] = ()) -> tuple[Template, ...]:
    """One template per verdict the detectors give on each fault scenario (all, or those of
    `families`). Played once per process (about 10 s for all twelve scenarios)."""
    out = []
    for info in list_scenarios():
        if info.family is None or (families and info.family not in families):
            continue
        run = simulate(info.name, seed=1, duration_s=TEMPLATE_SECONDS, nodes=1, gpus_per_node=8)
        for verdict in analyze_store(TraceStore.from_records(run.records(), run.meta)):
            nodes: list[str] = []
            gpus: list[str] = []
            ranks: dict[str, int] = {}
            _walk_identities(verdict, nodes, gpus, ranks)
            interval = verdict.get("interval") or {}
            start = float(interval.get("start") or run.start_ts)
            end = float(interval.get("end") or start + 60.0)
            out.append(
                Template(
                    family=str(verdict["family"]),
                    category=str(verdict["category"]),
                    text=json.dumps(verdict),
                    job=verdict["subject"].get("job"),
                    nodes=tuple(nodes),
                    gpus=tuple(gpus),
                    gpu_rank=ranks,
                    start=start,
                    length=max(end - start, 60.0),
                    confidence=float(verdict.get("confidence") or 0.8),
                )
            )
    return tuple(out)


def _shift(value: Any, delta: float) -> None:
    """Move every interval of the verdict by `delta` seconds."""
    if isinstance(value, dict):
        if set(value) == {"start", "end"}:
            for key in ("start", "end"):
                if isinstance(value[key], int | float):
                    value[key] = round(float(value[key]) + delta, 3)
            return
        for item in value.values():
            _shift(item, delta)
    elif isinstance(value, list):
        for item in value:
            _shift(item, delta)


def _moved(
    template: Template,
    job_id: str | None,
    job_nodes: list[str],
    rank_gpus: list[str],
    start: float,
    length: float,
    scale: float,
    confidence: float,
) -> dict[str, Any]:
    replace: dict[str, str] = {}
    if template.job and job_id:
        replace[template.job] = job_id
    for i, node in enumerate(template.nodes):
        replace[node] = job_nodes[i % len(job_nodes)]
    spare = 0
    for gpu in template.gpus:
        rank = template.gpu_rank.get(gpu)
        if rank is None:
            rank, spare = spare, spare + 1
        replace[gpu] = rank_gpus[rank % len(rank_gpus)]
    text = template.text
    if replace:
        pattern = re.compile("|".join(re.escape(k) for k in sorted(replace, key=len, reverse=True)))
        # Inside JSON strings: a replacement must not carry a quote or a backslash (ids never do).
        text = pattern.sub(lambda m: replace[m.group(0)], text)
    verdict: dict[str, Any] = json.loads(text)
    _shift(verdict, start - template.start)
    verdict["interval"] = {"start": round(start, 3), "end": round(start + length, 3)}
    impact = verdict.get("impact") or {}
    if impact.get("gpu_hours_lost") is not None:
        impact["gpu_hours_lost"] = round(float(impact["gpu_hours_lost"]) * scale, 3)
    verdict["confidence"] = confidence
    return verdict


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def seed_incidents(
    operator_id: int,
    rng: np.random.Generator,
    fleet: FleetSeed,
    *,
    count: int,
    now: float,
    families: tuple[str, ...] = (),
) -> tuple[int, list[tuple[int, int]]]:
    """`count` incidents over the fleet's jobs (and, for gpu_degrading, its GPUs). Returns how
    many, and the (node, GPU index) of the GPUs given a gpu_degrading incident."""
    templates = verdict_templates(families)
    if not templates or count <= 0 or not len(fleet.job_pks):
        return 0, []
    job_templates = [t for t in templates if t.family != GPU_DEGRADING]
    gpu_templates = [t for t in templates if t.family == GPU_DEGRADING]
    n_gpu = int(count * 0.04) if gpu_templates else 0
    n_job = count - n_gpu
    sizes = np.array([len(n) for n in fleet.job_nodes], dtype=np.float64)
    p = np.sqrt(sizes) * (1.0 + fleet.job_running)  # bigger and live jobs show more
    job_of = rng.choice(len(fleet.job_pks), n_job, p=p / p.sum())
    tmpl_of = rng.integers(0, len(job_templates), n_job)
    life = fleet.job_end[job_of] - fleet.job_start[job_of]
    lengths = np.array([job_templates[t].length for t in tmpl_of]) * rng.uniform(0.5, 6.0, n_job)
    lengths = np.minimum(lengths, np.maximum(life * 0.9, 60.0))
    starts = fleet.job_start[job_of] + rng.uniform(0.0, 1.0, n_job) * np.maximum(
        life - lengths, 0.0
    )
    # The newest incident of each (job, family) of a running job is open half the time, and
    # then still being seen; everything else has been resolved.
    family_codes = {f: i for i, f in enumerate(sorted({t.family for t in job_templates}))}
    family_of = np.array([family_codes[job_templates[t].family] for t in tmpl_of])
    order = np.lexsort((starts, family_of, job_of))
    is_last = np.ones(n_job, dtype=bool)
    same = (job_of[order][1:] == job_of[order][:-1]) & (
        family_of[order][1:] == family_of[order][:-1]
    )
    is_last[order[:-1][same]] = False
    open_ = is_last & fleet.job_running[job_of] & (rng.random(n_job) < 0.5)
    ends = starts + lengths
    ends[open_] = now - rng.uniform(0.0, 300.0, int(open_.sum()))
    starts[open_] = np.minimum(starts[open_], ends[open_] - 60.0)
    rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "public_id",
            "job_id",
            "family",
            "category",
            "confidence",
            "title",
            "subject_node",
            "subject_gpu",
            "subject_rank",
            "subject_mount",
            "state",
            "first_seen",
            "last_seen",
            "resolved_at",
            "resolve_reason",
            "verdict",
            "revision",
            "created_at",
            "updated_at",
        )
    }

    def add(
        template: Template,
        job: int | None,
        nodes: list[str],
        gpus: list[str],
        start: float,
        end: float,
        is_open: bool,
        scale: float,
    ) -> None:
        confidence = round(
            float(np.clip(template.confidence * rng.uniform(0.85, 1.03), 0.5, 0.99)), 2
        )
        verdict = _moved(
            template,
            fleet.job_ids[job] if job is not None else None,
            nodes,
            gpus,
            start,
            end - start,
            scale,
            confidence,
        )
        public_id = uuid.UUID(bytes=rng.bytes(16), version=4)
        verdict["id"] = str(public_id)
        subject = verdict.get("subject") or {}
        ended = job is not None and not fleet.job_running[job] and end >= fleet.job_end[job] - 1
        resolved_at = None if is_open else _dt(min(end + GRACE_S, now))
        rows["public_id"].append(public_id)
        rows["job_id"].append(int(fleet.job_pks[job]) if job is not None else None)
        rows["family"].append(template.family)
        rows["category"].append(template.category)
        rows["confidence"].append(confidence)
        rows["title"].append(str(verdict.get("title") or "")[:300])
        rows["subject_node"].append(subject.get("node") or "")
        rows["subject_gpu"].append(subject.get("gpu") or "")
        rows["subject_rank"].append(subject.get("rank"))
        rows["subject_mount"].append(subject.get("mount") or "")
        rows["state"].append(IncidentState.OPEN.value if is_open else IncidentState.RESOLVED.value)
        rows["first_seen"].append(_dt(start))
        rows["last_seen"].append(_dt(end))
        rows["resolved_at"].append(resolved_at)
        rows["resolve_reason"].append(
            ""
            if is_open
            else (ResolveReason.JOB_ENDED.value if ended else ResolveReason.FINDING_ABSENT.value)
        )
        rows["verdict"].append(verdict)
        rows["revision"].append(1 if is_open else 2)
        rows["created_at"].append(_dt(min(start + 30.0, now)))
        rows["updated_at"].append(_dt(end) if is_open else resolved_at)

    for i in range(n_job):
        j = int(job_of[i])
        nodes = [fleet.hostnames[int(n)] for n in fleet.job_nodes[j]]
        gpus = [fleet.gpu_uuids[int(n)][g] for n in fleet.job_nodes[j] for g in range(8)]
        template = job_templates[int(tmpl_of[i])]
        scale = (len(gpus) / 8.0) * (lengths[i] / template.length) * rng.uniform(0.7, 1.3)
        add(template, j, nodes, gpus, float(starts[i]), float(ends[i]), bool(open_[i]), scale)
    # gpu_degrading: one GPU each, its counters rising; open for the GPUs still at risk.
    n_nodes = len(fleet.node_ids)
    picked = rng.choice(n_nodes * 8, min(n_gpu, n_nodes * 8), replace=False) if n_gpu else ()
    at_risk = [divmod(int(flat), 8) for flat in picked]
    for k, (node, index) in enumerate(at_risk):
        template = gpu_templates[k % len(gpu_templates)]
        is_open = k % 3 == 0
        end = now - rng.uniform(0.0, 600.0) if is_open else now - rng.uniform(1.0, 20.0) * 86400
        start = end - template.length * rng.uniform(1.0, 20.0)
        gpus = [fleet.gpu_uuids[node][index]] * 8
        add(template, None, [fleet.hostnames[node]], gpus, start, end, is_open, 1.0)
    insert_columns(Incident, {"operator_id": [operator_id] * len(rows["family"]), **rows})
    _seed_revisions(operator_id, rows)
    return len(rows["family"]), at_risk


def _seed_revisions(operator_id: int, rows: dict[str, list[Any]]) -> None:
    """Each incident's created revision, and its resolved one where it was resolved."""
    ids = ids_of(Incident, "public_id", rows["public_id"])
    incident, number, kind, family, category, confidence, verdict, created = (
        [],
        [],
        [],
        [],
        [],
        [],
        [],
        [],
    )
    for i, public_id in enumerate(rows["public_id"]):
        kinds = [RevisionKind.CREATED.value]
        if rows["state"][i] == IncidentState.RESOLVED.value:
            kinds.append(RevisionKind.RESOLVED.value)
        for n, k in enumerate(kinds, start=1):
            incident.append(ids[public_id])
            number.append(n)
            kind.append(k)
            family.append(rows["family"][i])
            category.append(rows["category"][i])
            confidence.append(rows["confidence"][i])
            verdict.append(rows["verdict"][i])
            created.append(rows["created_at"][i] if n == 1 else rows["updated_at"][i])
    insert_columns(
        VerdictRevision,
        {
            "operator_id": [operator_id] * len(incident),
            "incident_id": incident,
            "number": number,
            "kind": kind,
            "family": family,
            "category": category,
            "confidence": confidence,
            "verdict": verdict,
            "created_at": created,
        },
    )
