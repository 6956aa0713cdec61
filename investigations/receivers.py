"""What investigations does when the apps below it announce something (ingest/signals.py).

Connected once in InvestigationsConfig.ready(); ingest never imports investigations.
"""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from engine.screen import SCREEN
from ingest.signals import batch_stored
from investigations import services


@receiver(batch_stored, dispatch_uid="investigations.note_job_data")
def note_stored_batch(
    sender: Any,
    *,
    operator_id: int,
    job_spans: dict[int, tuple[float, float]],
    node_spans: dict[int, tuple[float, float]],
    batch: Any = None,
    job_ids: dict[str, int] | None = None,
    node_ids: dict[str, int] | None = None,
    **kwargs: Any,
) -> None:
    """Record the jobs' data activity with the batch and schedule their evaluation: within
    seconds for the jobs (and nodes) whose batch shows a sign (engine/screen.py), else on the
    routine pass."""
    urgent_jobs: set[int] = set()
    urgent_nodes: set[int] = set()
    prompt_jobs: set[int] = set()
    prompt_nodes: set[int] = set()
    severe_jobs: set[int] = set()
    severe_nodes: set[int] = set()
    if batch is not None:
        signs = SCREEN.look(
            batch.series, batch.counts, batch.values, batch.logs, batch.events, batch.ts_ms
        )
        jobs, nodes = job_ids or {}, node_ids or {}
        urgent_jobs = {jobs[j] for j in signs.jobs if j in jobs}
        urgent_nodes = {nodes[n] for n in signs.nodes if n in nodes}
        prompt_jobs = {jobs[j] for j in signs.prompt_jobs if j in jobs}
        prompt_nodes = {nodes[n] for n in signs.prompt_nodes if n in nodes}
        severe_jobs = {jobs[j] for j in signs.severe_jobs if j in jobs}
        severe_nodes = {nodes[n] for n in signs.severe_nodes if n in nodes}
    services.note_job_data(
        operator_id,
        job_spans,
        node_spans,
        urgent_jobs=urgent_jobs,
        urgent_nodes=urgent_nodes,
        prompt_jobs=prompt_jobs,
        prompt_nodes=prompt_nodes,
        severe_jobs=severe_jobs,
        severe_nodes=severe_nodes,
    )
