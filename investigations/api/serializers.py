from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from investigations.api.verdict_schema import VerdictField
from investigations.incident_actions import COMMENT_MAX, NOTE_MAX, REASON_MAX, TICKET_ID_MAX
from investigations.models import (
    GpuListPrice,
    Incident,
    IncidentEvent,
    IncidentEventKind,
    IncidentTicket,
    TicketSystem,
    VerdictRevision,
)


class IncidentTicketSerializer(serializers.ModelSerializer[IncidentTicket]):
    class Meta:
        model = IncidentTicket
        fields = ["system", "ticket_id", "url", "linked_by", "linked_at"]
        read_only_fields = fields


class IncidentSerializer(serializers.ModelSerializer[Incident]):
    id = serializers.UUIDField(source="public_id", read_only=True)
    job = serializers.SerializerMethodField()
    assignee = serializers.SerializerMethodField(help_text="the assignee's username, or null")
    # Empty while open: a plain string here, or the schema's enum would refuse "".
    resolve_reason = serializers.CharField(
        read_only=True,
        help_text="while resolved: finding_absent, job_ended or manual; empty while open",
    )
    tickets = IncidentTicketSerializer(many=True, read_only=True)
    verdict = VerdictField()

    class Meta:
        model = Incident
        fields = [
            "id",
            "state",
            "family",
            "category",
            "confidence",
            "title",
            "job",
            "subject_node",
            "subject_gpu",
            "subject_rank",
            "subject_mount",
            "first_seen",
            "last_seen",
            "resolved_at",
            "resolve_reason",
            "revision",
            "acknowledged_at",
            "acknowledged_by",
            "assignee",
            "tickets",
            "verdict",
        ]
        read_only_fields = fields

    def get_job(self, incident: Incident) -> str | None:
        return incident.job.job_id if incident.job is not None else None

    def get_assignee(self, incident: Incident) -> str | None:
        return incident.assignee.get_username() if incident.assignee is not None else None


class IncidentEventSerializer(serializers.ModelSerializer[IncidentEvent]):
    kind = serializers.ChoiceField(choices=IncidentEventKind.choices, read_only=True)
    actor = serializers.CharField(
        read_only=True, help_text="a username, or api-token:<prefix> for an API token"
    )
    payload = serializers.JSONField(
        read_only=True,
        help_text=(
            "what the action carried: resolved {reason, note}; reopened {resolve_reason, "
            "resolved_at}; assigned {assignee, previous}; commented {body}; ticket_linked "
            "{system, ticket_id, url}; acknowledged {}"
        ),
    )

    class Meta:
        model = IncidentEvent
        fields = ["id", "kind", "actor", "at", "payload"]
        read_only_fields = fields


class ResolveSerializer(serializers.Serializer[dict[str, Any]]):
    reason = serializers.CharField(
        required=False, allow_blank=True, max_length=REASON_MAX, help_text="why, in a line"
    )
    note = serializers.CharField(required=False, allow_blank=True, max_length=NOTE_MAX)


class AssignSerializer(serializers.Serializer[dict[str, Any]]):
    user = serializers.CharField(
        allow_null=True,
        max_length=254,
        help_text="an operator member's username or e-mail; null to unassign",
    )


class CommentSerializer(serializers.Serializer[dict[str, Any]]):
    body = serializers.CharField(max_length=COMMENT_MAX)


class LinkTicketSerializer(serializers.Serializer[dict[str, Any]]):
    system = serializers.ChoiceField(choices=TicketSystem.choices)
    ticket_id = serializers.CharField(max_length=TICKET_ID_MAX)
    url = serializers.URLField(
        required=False, allow_blank=True, max_length=1000, default="", help_text="http(s) URL"
    )


class EvidenceChartSerializer(serializers.Serializer[dict[str, Any]]):
    x = serializers.ListField(child=serializers.FloatField(), help_text="bucket times (epoch s)")
    series = serializers.ListField(
        child=serializers.DictField(),
        help_text="{label, values (null: no sample in the bucket), unit} per line",
    )
    interval = serializers.ListField(child=serializers.FloatField())
    baseline = serializers.FloatField(allow_null=True)
    y_label = serializers.CharField()
    window = serializers.ListField(child=serializers.FloatField())


class EvidenceSeriesSerializer(serializers.Serializer[dict[str, Any]]):
    evidence = serializers.DictField(help_text="the verdict's evidence entry (docs/design.md §7)")
    # Named as the response names it; DRF's metaclass takes it out of the class attributes.
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=["series", "events", "log", "value"], help_text="what the lines draw"
    )
    baseline_source = serializers.CharField(
        help_text='"verdict", "others", "before", "count before" or "" (none drawn)'
    )
    lines = serializers.IntegerField(help_text="how many of the evidence's own series were read")
    chart = EvidenceChartSerializer()


class EvidenceSeriesPageSerializer(serializers.Serializer[dict[str, Any]]):
    incident = serializers.UUIDField()
    margin = serializers.DictField(help_text="the window around each interval: min_s, max_s")
    items = EvidenceSeriesSerializer(many=True)


class VerdictRevisionSerializer(serializers.ModelSerializer[VerdictRevision]):
    verdict = VerdictField()

    class Meta:
        model = VerdictRevision
        fields = ["number", "kind", "family", "category", "confidence", "created_at", "verdict"]
        read_only_fields = fields


class GpuListPriceSerializer(serializers.ModelSerializer[GpuListPrice]):
    class Meta:
        model = GpuListPrice
        fields = ["id", "gpu_model", "price_per_gpu_hour", "currency", "updated_at"]
        read_only_fields = fields


class GpuListPriceWriteSerializer(serializers.Serializer[dict[str, Any]]):
    gpu_model = serializers.CharField(max_length=128)
    price_per_gpu_hour = serializers.DecimalField(
        max_digits=10, decimal_places=4, min_value=Decimal("0.0001")
    )
    currency = serializers.CharField(max_length=3, default="USD")


# The longest period one request may ask for: it aggregates usage rows, not samples, so this
# bounds nothing expensive; it catches a typo'd year (as the console's /price/ does).
MAX_PERIOD_DAYS = 366
_T = TypeVar("_T")


def _parse(parser: Callable[[str], _T | None], text: str) -> _T | None:
    """A Django date parser's result, None for text it cannot read (it raises on a date that
    does not exist: 2026-02-30)."""
    try:
        return parser(text)
    except ValueError:
        return None


@extend_schema_field({"type": "string", "description": "ISO 8601 date (2026-12-01) or date-time"})
class PeriodBoundField(serializers.Field):  # type: ignore[type-arg]
    """An ISO 8601 date-time (UTC when it has no offset) or date. A date is the start of that
    day for `start` and the end of it for `end` (whole days inclusive, as the console's
    /price/ reads them)."""

    def __init__(self, *, end_of_day: bool, **kwargs: Any) -> None:
        self.end_of_day = end_of_day
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> datetime:
        text = str(data).strip()
        # A date first: Python's fromisoformat (under parse_datetime) reads a bare date as its
        # midnight, which would make `end=2026-12-01` exclude the day it names.
        day = _parse(parse_date, text)
        if day is not None:
            midnight = datetime.combine(day, time(), UTC)
            return midnight + timedelta(days=1) if self.end_of_day else midnight
        moment = _parse(parse_datetime, text)
        if moment is not None:
            return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
        raise serializers.ValidationError(
            f"not an ISO 8601 date or date-time: {text!r} (e.g. 2026-12-01 or 2026-12-01T08:00:00Z)"
        )

    def to_representation(self, value: datetime) -> str:
        return value.isoformat()


class RealPriceQuerySerializer(serializers.Serializer[dict[str, Any]]):
    job = serializers.CharField(required=False, help_text="a scheduler job id")
    customer = serializers.IntegerField(required=False)
    gpu = serializers.CharField(required=False, help_text="a GPU UUID")
    start = PeriodBoundField(
        end_of_day=False,
        required=False,
        help_text="the period's start: ISO 8601 date or date-time (UTC if no offset)",
    )
    end = PeriodBoundField(
        end_of_day=True,
        required=False,
        help_text="the period's end (exclusive; a date: the end of that day); default now",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if len({"job", "customer", "gpu"} & set(attrs)) > 1:
            raise serializers.ValidationError("pass at most one of job, customer, gpu")
        if "end" in attrs and "start" not in attrs:
            raise serializers.ValidationError({"start": ["required when end is given"]})
        if "start" in attrs:
            end = attrs.setdefault("end", datetime.now(UTC))
            if end <= attrs["start"]:
                raise serializers.ValidationError(
                    {"end": [f"must be after start ({attrs['start'].isoformat()})"]}
                )
            if end - attrs["start"] > timedelta(days=MAX_PERIOD_DAYS):
                raise serializers.ValidationError(
                    {"end": [f"the period may be at most {MAX_PERIOD_DAYS} days"]}
                )
        return attrs


# One aggregate, even though it answers the list route: not a list in the schema.
@extend_schema_serializer(many=False)
class RealPriceSerializer(serializers.Serializer[dict[str, Any]]):
    start = serializers.DateTimeField(required=False, help_text="the period asked for, if any")
    end = serializers.DateTimeField(required=False)
    job = serializers.CharField(required=False, help_text="the filter asked for, if any")
    customer = serializers.CharField(required=False)
    gpu = serializers.CharField(required=False)
    gpu_hours = serializers.FloatField()
    compute_hours = serializers.FloatField()
    wait_hours = serializers.FloatField()
    idle_hours = serializers.FloatField()
    productive_share = serializers.FloatField(allow_null=True)
    list_cost = serializers.DecimalField(max_digits=20, decimal_places=4, allow_null=True)
    effective_price_per_productive_gpu_hour = serializers.DecimalField(
        max_digits=20, decimal_places=4, allow_null=True
    )
    currency = serializers.CharField(allow_null=True)
    unpriced_models = serializers.ListField(child=serializers.CharField())
    methods = serializers.ListField(child=serializers.CharField())
