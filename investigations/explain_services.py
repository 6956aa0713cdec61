"""The investigation agent on live verdicts: one explanation per verdict revision.

`explain_incident` is what the `investigations.explain_verdict` task runs, enqueued after the
commit of each new revision (investigations/tasks.py), so a verdict never waits for its
explanation. It re-reads the revision, builds the job's window over ingest's stored data
(`investigations.live.IngestStore`, the detectors' own interface), runs the investigator
(docs/investigations.md) outside any transaction — the model takes seconds — and then stores
the `investigation` object and the explanation on the revision and, while that revision is
still the incident's current verdict, on the incident.

The writer (the local GGUF, or the endpoint of PROOF_EXPLAIN_ENDPOINT) is built from the
settings once per process: the model is loaded once per worker.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.conf import settings
from django.db import connection

from engine.window import JobWindow, build_job_window
from investigations.live import IngestStore
from investigations.models import Incident, JobActivity, VerdictRevision
from investigations.services import window_start
from investigator.model import (
    EndpointRefused,
    ExplainUnavailable,
    LlamaCppWriter,
    OpenAICompatibleWriter,
    Writer,
)
from investigator.run import investigate
from tenants.context import tenant_context

log = logging.getLogger(__name__)

_WRITER: Writer | None = None
_WRITER_LOCK = threading.Lock()


def configured_writer() -> Writer:
    """The process's writer, from the settings (PROOF_EXPLAIN_* in .env.example)."""
    global _WRITER
    with _WRITER_LOCK:
        if _WRITER is None:
            endpoint = settings.PROOF_EXPLAIN_ENDPOINT
            if endpoint:
                _WRITER = OpenAICompatibleWriter(
                    endpoint,
                    settings.PROOF_EXPLAIN_ENDPOINT_MODEL,
                    allow_remote=settings.PROOF_EXPLAIN_ALLOW_REMOTE,
                )
            else:
                _WRITER = LlamaCppWriter(settings.PROOF_EXPLAIN_MODEL_PATH or None)
        return _WRITER


def job_window(operator_id: int, incident: Incident) -> JobWindow | None:
    """The job's sliding window as the evaluation that produced the verdict read it."""
    if incident.job_id is None:
        return None  # fleet health: the verdict's own evidence is all there is
    activity = (
        JobActivity.objects.for_tenant(operator_id)
        .filter(job_id=incident.job_id)
        .select_related("job")
        .first()
    )
    if activity is None:
        return None
    t1 = activity.last_data_ts
    t0 = window_start(activity.first_data_ts, t1)
    job = activity.job.job_id
    store = IngestStore(operator_id, {job: (activity.first_data_ts, activity.last_data_ts)})
    return build_job_window(store, job, t0, t1)


def write_first() -> None:
    """On SQLite a transaction that reads and then writes cannot take the write lock once
    ingest has committed since its read (investigations/services.py, _take_write_lock): make
    the first statement a write."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            # S608: the table name is the model's own, never input.
            cursor.execute(f"UPDATE {VerdictRevision._meta.db_table} SET id = id WHERE 0")  # noqa: S608


def explain_incident(
    operator_id: int, incident_pk: int, revision: int, writer: Writer | None = None
) -> str:
    """Explain revision `revision` of the incident; returns what happened: "explained",
    "fallback" (the template text kept, marked), "missing", "stale" (a newer revision is
    current: stored on its revision only) or "unavailable" (no model: logged, nothing stored)."""
    with tenant_context(operator_id):
        row = (
            VerdictRevision.objects.for_tenant(operator_id)
            .select_related("incident")
            .filter(incident_id=incident_pk, number=revision)
            .first()
        )
        if row is None:
            return "missing"
        if row.incident.revision != revision:
            return "stale"  # superseded before its turn: the newer revision's task explains it
        verdict: dict[str, Any] = dict(row.verdict)
        window = job_window(operator_id, row.incident)
    try:
        writer = writer or configured_writer()
    except (ExplainUnavailable, EndpointRefused) as exc:
        log.warning("explanation of incident %s skipped: %s", incident_pk, exc)
        return "unavailable"
    inv = investigate(verdict, window, writer)
    explained = inv.apply(verdict)
    with tenant_context(operator_id):
        write_first()
        VerdictRevision.objects.for_tenant(operator_id).filter(pk=row.pk).update(verdict=explained)
        incident = (
            Incident.objects.for_tenant(operator_id).select_for_update().filter(pk=incident_pk)
        ).first()
        # Same revision: later evaluations only extended it without a material change
        # (services.merge_verdicts keeps the investigation on those).
        current = incident is not None and incident.revision == revision
        if incident is not None and current:
            Incident.objects.for_tenant(operator_id).filter(pk=incident_pk).update(
                verdict={
                    **incident.verdict,
                    **{k: explained[k] for k in ("explanation", "investigation")},
                }
            )
    if not current:
        return "stale"
    return "fallback" if inv.fallback else "explained"
