"""All periodic tasks in one place, each with the reason it runs at that rate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Periodic:
    task: str
    every_seconds: float
    reason: str
    kwargs: dict[str, Any] | None = None

    def as_celery(self) -> dict[str, Any]:
        return {"task": self.task, "schedule": self.every_seconds, "kwargs": self.kwargs or {}}


BEAT_SCHEDULE: dict[str, Periodic] = {
    "investigations-fan-out-jobs": Periodic(
        task="investigations.fan_out_job_evaluations",
        every_seconds=15,
        reason=(
            "the routine pass: every active job whose data no evaluation saw in the last 30 s "
            "(ROUTINE_S) — an ingest signal debounced, lost or skipped on a busy lock, a "
            "worker restarted — and incident resolution; every 15 s so a job waits at most "
            "45 s, while batches showing a sign are evaluated within seconds by the signal"
        ),
    ),
    "investigations-fan-out-fleet-health": Periodic(
        task="investigations.fan_out_fleet_health",
        every_seconds=600,
        reason=(
            "gpu_degrading looks at trends over hours (rising SBE rate, growing remaps, "
            "recurring throttling); evaluating every GPU more often than every 10 min would "
            "cost reads without changing a verdict"
        ),
    ),
    "investigations-fan-out-forecasts": Periodic(
        task="investigations.fan_out_forecasts",
        every_seconds=3600,
        reason=(
            "the days-ahead forecast reads hourly rollups (ingest-rollups, every 15 min) over "
            "14 days and flags components 2-12 days ahead; hourly sees each new rollup hour "
            "once, and more often would re-read the same hours for the same answer"
        ),
    ),
    "investigations-expire-questions": Periodic(
        task="investigations.expire_stale_questions",
        every_seconds=300,
        reason=(
            "a question whose answer task was lost with its worker stays pending: after 15 min "
            "(ask_services.STALE_S, far past the model's 10–30 s) it is refused as not answered "
            "in time, so a page never polls forever and nothing is retried forever; every 5 min "
            "is enough for a bound of that size"
        ),
    ),
    "notify-deliver-due": Periodic(
        task="notify.deliver_due",
        every_seconds=5,
        reason=(
            "sends the notification outbox's due rows: retries (Standard Webhooks' schedule "
            "starts at 5 s) and any row whose after-commit kick was lost; new verdicts are "
            "kicked at commit, so 5 s bounds a lost kick's delay at a cheap indexed read"
        ),
    ),
    "ingest-rollups": Periodic(
        task="ingest.rollup_recent_hours",
        every_seconds=900,
        reason=(
            "hourly rollups feed the long-range reads (a GPU's counters over 30 days); "
            "re-rolling the last 3 hours every 15 min picks up late batches and keeps the "
            "current hour at most 15 min stale, for a read that looks at days"
        ),
    ),
    "ingest-partitions": Periodic(
        task="ingest.maintain_partitions",
        every_seconds=3600,
        reason=(
            "creates a week of daily sample partitions ahead and drops those past retention; "
            "hourly is far more often than a day rolls over, so a missed run costs nothing"
        ),
    ),
    "ingest-retention": Periodic(
        task="ingest.delete_expired_rows",
        every_seconds=86400,
        reason="logs, events and receipts past PROOF_INGEST_RETENTION_DAYS; retention is in days",
    ),
    "billing-meter-usage": Periodic(
        task="billing.meter_usage",
        every_seconds=3600,
        reason=(
            "writes each finished UTC day's usage rows once its last hour is rolled up (1 h "
            "after midnight) and re-meters the last 7 days for late batches; hourly is far "
            "more often than a day ends, so a missed run delays a day's rows by an hour at most"
        ),
    ),
    "billing-deliver-meter-events": Periodic(
        task="billing.deliver_meter_events",
        every_seconds=60,
        reason=(
            "sends the meter-event outbox to Stripe (new rows appear hourly at most) and "
            "retries on its schedule, whose first step is 5 s and whose steps are minutes; "
            "a minute keeps usage on Stripe within minutes of metering"
        ),
    ),
    "billing-reconcile": Periodic(
        task="billing.reconcile",
        every_seconds=6 * 3600,
        reason=(
            "compares Stripe's per-day meter totals with ours for this month (and last month "
            "in its first days), days before Stripe's 35-day limit on late events closes"
        ),
    ),
    "billing-advance-dunning": Periodic(
        task="billing.advance_dunning",
        every_seconds=3600,
        reason=(
            "pauses verdicts of accounts whose grace period (days) ended; payments resume "
            "them at once from the webhook, so an hour's delay only ever delays a pause"
        ),
    ),
    "billing-check-licence": Periodic(
        task="billing.check_licence",
        every_seconds=86400,
        reason=(
            "an air-gapped site's licence (expiry in days, GPU cap): daily, as well as at "
            "start; a no-op where no licence file is configured"
        ),
    ),
    "billing-close-months": Periodic(
        task="billing.close_months",
        every_seconds=6 * 3600,
        reason=(
            "writes last month's local invoice once the month is over (idempotent; updated "
            "while a draft, as late days are metered): a few hours after midnight is enough"
        ),
    ),
}
