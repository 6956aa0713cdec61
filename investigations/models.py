"""Incidents and their verdicts (docs/design.md §7), the live pipeline's bookkeeping, list prices.

- `Incident`: one per (job, family) — or per GPU for `gpu_degrading` — while it is open. It
  holds the current verdict (the docs/design.md §7 JSON) plus indexed copies of the fields queries
  filter on (family, category, confidence, subject). Every material change of the verdict is
  kept as a `VerdictRevision`.
- `NotificationLog`: one row per notification fired; its unique key is what makes the
  notification hook exactly-once (investigations/notifications.py).
- `JobActivity`: when data for a job last arrived and how far it has been evaluated (what the
  periodic fan-out and the ingest signal read), and how far its GPU time has been accounted.
- `JobGpuUsage`: a job's GPU time on one GPU split into compute / waiting / idle
  (docs/pricing.md), accumulated sample by sample as evaluations pass over new data.
- `GpuListPrice`: the operator's list price per GPU-hour for one GPU model.
- `IncidentEvent`: what people did to an incident through the API (acknowledge, resolve,
  reopen, assign, comment, link a ticket), who and when: its history.
- `IncidentTicket`: an external ticket (Zendesk, Jira, …) linked to an incident.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from django.db import models
from django.db.models import Q

from ingest.models import Job
from tenants.models import TenantOwned, operator_index, unique_per_operator

GPU_DEGRADING = "gpu_degrading"


class IncidentState(models.TextChoices):
    OPEN = "open", "Open"
    RESOLVED = "resolved", "Resolved"


class ResolveReason(models.TextChoices):
    FINDING_ABSENT = "finding_absent", "The finding was absent for the grace period"
    JOB_ENDED = "job_ended", "The job ended"
    # Someone resolved it (POST /api/v1/incidents/<id>/resolve/); their reason is in its history.
    MANUAL = "manual", "Resolved by a person"


class VerdictGpuHoursLost(models.Func):
    """The verdict's `impact.gpu_hours_lost` where it is a JSON number, else NULL (hardware
    faults and fleet health state none): a generated column's expression, so a verdict that
    carried a string there would store NULL, never fail the write."""

    output_field = models.FloatField()
    _PATH = "$.impact.gpu_hours_lost"

    def __init__(self) -> None:
        super().__init__(models.F("verdict"))

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler,
            connection,
            template=(
                "CASE WHEN jsonb_typeof(%(expressions)s -> 'impact' -> 'gpu_hours_lost') = "
                "'number' THEN (%(expressions)s -> 'impact' ->> 'gpu_hours_lost')"
                "::double precision END"
            ),
            **extra,
        )

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler,
            connection,
            template=(
                f"CASE WHEN json_type(%(expressions)s, '{self._PATH}') IN ('integer', 'real') "
                f"THEN CAST(json_extract(%(expressions)s, '{self._PATH}') AS REAL) END"
            ),
            **extra,
        )


class Incident(TenantOwned):
    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    family = models.CharField(max_length=64)
    category = models.CharField(max_length=32)
    confidence = models.FloatField()
    title = models.CharField(max_length=300, blank=True, default="")
    subject_node = models.CharField(max_length=255, blank=True, default="")
    subject_gpu = models.CharField(max_length=96, blank=True, default="")
    subject_rank = models.IntegerField(null=True, blank=True)
    subject_mount = models.CharField(max_length=500, blank=True, default="")
    state = models.CharField(
        max_length=16, choices=IncidentState.choices, default=IncidentState.OPEN
    )
    # Data time (the verdict's interval), not wall time: agents may replay or lag.
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolve_reason = models.CharField(
        max_length=32, choices=ResolveReason.choices, blank=True, default=""
    )
    verdict = models.JSONField()
    # The verdict's impact.gpu_hours_lost, kept by the database beside it (a stored generated
    # column: every write of the verdict, bulk ones included, updates it): the price page sums
    # the open verdicts' losses, and reading each one's JSON (~7 KB, de-TOASTed) for it was
    # ~32 ms of 1,250 open verdicts on the console bench.
    gpu_hours_lost = models.GeneratedField(
        expression=VerdictGpuHoursLost(), output_field=models.FloatField(), db_persist=True
    )
    revision = models.IntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # People's handling of it (investigations/incident_actions.py); the events say who did what.
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=200, blank=True, default="")
    assignee = models.ForeignKey(
        "auth.User", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    customer_path: ClassVar[str | None] = "job__customer"

    class Meta:
        ordering = ["-last_seen", "-id"]
        constraints = [
            unique_per_operator(
                "job",
                "family",
                name="investigations_one_open_incident_per_job_family",
                condition=Q(state="open", job__isnull=False),
            ),
            unique_per_operator(
                "subject_gpu",
                "family",
                name="investigations_one_open_incident_per_gpu_family",
                condition=Q(state="open", job__isnull=True),
            ),
        ]
        indexes = [
            operator_index("state", "last_seen", name="inv_incident_state"),
            operator_index("family", "category", name="inv_incident_family"),
            operator_index("confidence", name="inv_incident_confidence"),
            operator_index("subject_gpu", name="inv_incident_gpu"),
            # The console's incident list (frontend/selectors/incidents.py): its default order
            # (open first, newest first), and its node and category filters and first-seen
            # sort, each an index range read in order and stopped at the page's 50 rows.
            operator_index("state", "-last_seen", "-id", name="inv_incident_open_first"),
            operator_index("subject_node", "-last_seen", name="inv_incident_node"),
            operator_index("category", "state", "-last_seen", name="inv_incident_category"),
            operator_index("first_seen", name="inv_incident_first_seen"),
            # A customer's incidents are its jobs' (`customer_path`): read job by job, index only.
            operator_index("job", "state", "-last_seen", name="inv_incident_job"),
        ]

    def __str__(self) -> str:
        return f"{self.family} ({self.state}) {self.public_id}"


class RevisionKind(models.TextChoices):
    CREATED = "created", "Created"
    UPDATED = "updated", "Updated"
    CATEGORY_CHANGED = "category_changed", "Category changed"
    FAMILY_CHANGED = "family_changed", "Family changed"
    RESOLVED = "resolved", "Resolved"


class VerdictRevision(TenantOwned):
    """One kept version of an incident's verdict."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="revisions")
    number = models.IntegerField()
    kind = models.CharField(max_length=32, choices=RevisionKind.choices)
    family = models.CharField(max_length=64)
    category = models.CharField(max_length=32)
    confidence = models.FloatField()
    verdict = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    customer_path: ClassVar[str | None] = "incident__job__customer"

    class Meta:
        ordering = ["incident_id", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["incident", "number"], name="investigations_revision_number"
            )
        ]


class NotificationKind(models.TextChoices):
    NEW = "new", "New verdict"
    CHANGED = "changed", "Category or family changed"


class NotificationLog(TenantOwned):
    """The idempotency record of the notification hook: inserted before subscribers are
    called, unique on (incident, kind, family, category), so a retried or concurrent evaluation
    that reaches the same notification finds the row and fires nothing."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="+")
    revision = models.ForeignKey(VerdictRevision, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=NotificationKind.choices)
    family = models.CharField(max_length=64)
    category = models.CharField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    customer_path: ClassVar[str | None] = "incident__job__customer"

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["incident", "kind", "family", "category"],
                name="investigations_notify_once",
            )
        ]


class JobActivity(TenantOwned):
    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="+")
    # Earliest and latest sample/record time seen for the job (seconds since the epoch, data
    # time: agents may replay or lag, so wall time says nothing about the window).
    first_data_ts = models.FloatField()
    last_data_ts = models.FloatField()
    received_at = models.DateTimeField()  # wall time the last batch for it was stored
    evaluated_through_ts = models.FloatField(null=True, blank=True)
    evaluated_at = models.DateTimeField(null=True, blank=True)
    usage_through_ts = models.FloatField(null=True, blank=True)
    # Batches whose data began well before the newest data already seen (an agent shipping its
    # spool after an outage, batches stored out of order while ingest is behind), and the
    # earliest first sample time of those counted after `late_consumed`: an evaluation whose
    # cached window (investigations/window_cache.py) holds every late batch up to at least
    # `late_consumed` re-reads from there, and then marks them consumed (late_first_ts
    # cleared, late_consumed = late_batches, if no other came meanwhile).
    late_batches = models.IntegerField(default=0)
    late_first_ts = models.FloatField(null=True, blank=True)
    late_consumed = models.IntegerField(default=0)

    customer_path: ClassVar[str | None] = "job__customer"

    class Meta:
        indexes = [operator_index("received_at", name="inv_activity_recv")]


class JobGpuUsage(TenantOwned):
    """GPU-seconds of one job on one GPU, split by what the GPU was doing (docs/pricing.md)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    gpu = models.CharField(max_length=96)
    node = models.CharField(max_length=255, blank=True, default="")
    gpu_model = models.CharField(max_length=128, blank=True, default="")
    gpu_seconds = models.FloatField(default=0.0)
    compute_seconds = models.FloatField(default=0.0)
    wait_seconds = models.FloatField(default=0.0)
    idle_seconds = models.FloatField(default=0.0)
    first_ts = models.FloatField(null=True, blank=True)
    last_ts = models.FloatField(null=True, blank=True)
    # Which estimate was possible: "engine+ebpf", "engine", "util" (docs/pricing.md).
    method = models.CharField(max_length=32, blank=True, default="")

    customer_path: ClassVar[str | None] = "job__customer"

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "gpu"], name="investigations_usage_job_gpu")
        ]
        # The console's real price over a period reads the rows whose last sample is in it or
        # after (/price/, /fleet/'s cards): recent periods skip the fleet's history.
        indexes = [
            operator_index("last_ts", name="inv_usage_last_ts"),
            # A job's sums (its productive share, which /jobs/?sort=share computes for every
            # job; the list's real prices) from an index-only scan, not a heap read per GPU.
            # operator_id is in it for the row-level-security filter.
            models.Index(
                fields=["job", "operator"],
                include=[
                    "gpu_model",
                    "method",
                    "gpu_seconds",
                    "compute_seconds",
                    "wait_seconds",
                    "idle_seconds",
                ],
                name="inv_usage_job_sums",
            ),
        ]

    @property
    def productive_share(self) -> float | None:
        return self.compute_seconds / self.gpu_seconds if self.gpu_seconds > 0 else None


class GpuListPrice(TenantOwned):
    """What the operator charges per GPU-hour for one GPU model (as NVML names it)."""

    gpu_model = models.CharField(max_length=128)
    price_per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4)
    currency = models.CharField(max_length=3, default="USD")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["gpu_model"]
        constraints = [
            unique_per_operator("gpu_model", name="investigations_price_per_model"),
            models.CheckConstraint(
                condition=Q(price_per_gpu_hour__gt=0), name="investigations_price_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_model}: {self.price_per_gpu_hour} {self.currency}/GPU-h"


class ShareLink(TenantOwned):
    """A read-only link to one incident's customer-facing verdict page for people without an
    account (docs/notifications.md). The URL's token is stored as its SHA-256 only; the row is
    read on every open, so a revoke or an expiry takes effect on the next request."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="share_links")
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        "auth.User", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)

    customer_path: ClassVar[str | None] = "incident__job__customer"

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [operator_index("incident", "-created_at", name="inv_share_link_incident")]


class ShareLinkOpen(TenantOwned):
    """One open of a share link: when, from which client address, with which user agent."""

    link = models.ForeignKey(ShareLink, on_delete=models.CASCADE, related_name="opens")
    opened_at = models.DateTimeField(auto_now_add=True)
    address = models.GenericIPAddressField(null=True, blank=True)
    user_agent = models.CharField(max_length=500, blank=True, default="")

    customer_path: ClassVar[str | None] = "link__incident__job__customer"

    class Meta:
        ordering = ["-opened_at", "-id"]
        indexes = [operator_index("link", "-opened_at", name="inv_share_open_link")]


class IncidentEventKind(models.TextChoices):
    ACKNOWLEDGED = "acknowledged", "Acknowledged"
    RESOLVED = "resolved", "Resolved"
    REOPENED = "reopened", "Reopened"
    ASSIGNED = "assigned", "Assigned"
    COMMENTED = "commented", "Commented"
    TICKET_LINKED = "ticket_linked", "Ticket linked"


class IncidentEvent(TenantOwned):
    """One thing a person (or an API token) did to an incident: its history. `actor` is the
    user's username or `api-token:<prefix>`, kept as text so the history outlives the user or
    the token; `payload` holds what the action carried (a reason, a comment's body, the
    assignee, the ticket)."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32, choices=IncidentEventKind.choices)
    actor = models.CharField(max_length=200)
    actor_user = models.ForeignKey(
        "auth.User", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    at = models.DateTimeField(auto_now_add=True)
    payload = models.JSONField(default=dict)

    customer_path: ClassVar[str | None] = "incident__job__customer"

    class Meta:
        ordering = ["at", "id"]
        indexes = [operator_index("incident", "at", "id", name="inv_incident_event")]


class TicketSystem(models.TextChoices):
    ZENDESK = "zendesk", "Zendesk"
    JIRA = "jira", "Jira"
    FRESHDESK = "freshdesk", "Freshdesk"
    SERVICENOW = "servicenow", "ServiceNow"
    OTHER = "other", "Other"


class IncidentTicket(TenantOwned):
    """An external ticket about an incident; one incident may have several, and the same
    (system, ticket id) is linked once (linking it again changes nothing)."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="tickets")
    system = models.CharField(max_length=16, choices=TicketSystem.choices)
    ticket_id = models.CharField(max_length=200)
    url = models.URLField(max_length=1000, blank=True, default="")
    linked_by = models.CharField(max_length=200)
    linked_at = models.DateTimeField(auto_now_add=True)

    customer_path: ClassVar[str | None] = "incident__job__customer"

    class Meta:
        ordering = ["linked_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["incident", "system", "ticket_id"], name="investigations_ticket_once"
            )
        ]


class VerdictHold(TenantOwned):
    """New verdicts of this operator are held back: while the row exists, evaluations still
    run and account GPU time, but merge nothing (no incident, no notification). Written by the
    layer that decides (billing's dunning, an expired licence) through
    investigations/verdict_hold.py; on release the held period is evaluated
    (`evaluate_held_period`), so holding never loses a verdict, it delays it. Ingest never
    looks at it."""

    reason = models.CharField(max_length=300)
    held_since = models.DateTimeField()

    class Meta:
        constraints = [unique_per_operator(name="investigations_one_hold")]


class QuestionState(models.TextChoices):
    PENDING = "pending", "Pending"
    ANSWERED = "answered", "Answered"
    REFUSED = "refused", "Refused"


class IncidentQuestion(TenantOwned):
    """A question someone asked about an incident ("Ask about this incident", docs/
    investigations.md), answered by the investigator's checks and validator in a Celery task
    (investigations/ask_services.py). `answer` is only ever validated model text or a refusal
    saying why (`refused`, `reason`); `detail` holds how it was answered (model, attempts, the
    validator's complaints, tokens, the checks read). `revision` is the verdict revision the
    question was asked about."""

    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="questions")
    revision = models.PositiveIntegerField()
    asked_by = models.CharField(max_length=200)  # a username or api-token:<prefix>
    asked_by_user = models.ForeignKey(
        "auth.User", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    question = models.TextField()
    state = models.CharField(
        max_length=16, choices=QuestionState.choices, default=QuestionState.PENDING
    )
    answer = models.TextField(blank=True, default="")
    cited = models.JSONField(default=list)
    validated = models.BooleanField(default=False)
    refused = models.BooleanField(default=False)
    reason = models.TextField(blank=True, default="")
    detail = models.JSONField(default=dict)
    duration_s = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    answered_at = models.DateTimeField(null=True, blank=True)

    customer_path: ClassVar[str | None] = "incident__job__customer"

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [operator_index("incident", "-created_at", name="inv_question_incident")]

    def __str__(self) -> str:
        return f"{self.incident_id}: {self.question[:40]}"


class ComponentForecast(TenantOwned):
    """The days-ahead forecast of one component (engine/forecast.py): a GPU, its PCIe link or
    NVLink (key: the GPU's UUID), or an IB port (key: "node/device/port"). One row per
    component, rewritten by each forecast pass (investigations/forecast_services.py); a
    component whose signs stop goes back to "ok" with `cleared_at` set, so nothing stays
    flagged after a recovery. `result` is `engine.forecast.component_result`'s JSON: risk,
    evidence and the daily series the /health/ charts draw."""

    kind = models.CharField(max_length=16)  # gpu | pcie | nvlink | ib_port
    key = models.CharField(max_length=200)
    node = models.CharField(max_length=200)
    gpu = models.CharField(max_length=100, blank=True, default="")
    level = models.CharField(max_length=8, default="ok")  # ok | watch | drain | urgent
    risk_1d = models.FloatField(default=0.0)
    risk_3d = models.FloatField(default=0.0)
    risk_7d = models.FloatField(default=0.0)
    ttf_hours = models.FloatField(null=True, blank=True)
    summary = models.TextField(blank=True, default="")
    result = models.JSONField(default=dict)
    evaluated_at = models.DateTimeField()
    level_since = models.DateTimeField()
    cleared_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [unique_per_operator("kind", "key", name="investigations_forecast_unique")]
        indexes = [operator_index("level", "risk_7d", name="investigations_forecast_level")]
