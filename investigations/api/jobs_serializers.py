"""Shapes of the jobs API (investigations/api/jobs.py): its query parameters, checked before
anything is read, and its responses, which describe it in the OpenAPI schema."""

from __future__ import annotations

import math
import re
from datetime import UTC, date, datetime
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ingest.models import JobState

# The job kinds the trace format knows (docs/trace-format.md, `job.kind`).
JOB_KINDS = ("training", "inference")
# `?ordering=` keys and the column each orders by (ties: the primary key, same direction).
JOB_ORDERINGS = {
    "started": "first_seen_at",
    "last_seen": "last_seen_at",
    "job": "job_id",
}
DEFAULT_JOB_ORDERING = "-started"
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# The last second of year 9999: any later time cannot be a datetime, so it is bad input.
LATEST_TIMESTAMP = 253_402_300_799.0


@extend_schema_field(
    {
        "oneOf": [
            {"type": "number", "minimum": 0, "description": "seconds since the epoch"},
            {"type": "string", "format": "date-time"},
            {"type": "string", "format": "date", "description": "that day (UTC)"},
        ]
    }
)
class TimestampField(serializers.Field):  # type: ignore[type-arg]
    """A point in time: seconds since the epoch (`1767225600.5`), ISO 8601 with a zone
    (`2026-01-01T00:00:00Z`) or a bare date, that day in UTC (its start, or with `end_of_day`
    its last millisecond: `until=2026-12-01` includes the 1st); read as float seconds. A time
    without a zone is refused: it could be any of 26 instants."""

    def __init__(self, *, end_of_day: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.end_of_day = end_of_day

    default_error_messages = {
        "invalid": (
            "seconds since the epoch (up to the year 9999) or an ISO 8601 time with a zone, "
            "not {value!r}"
        ),
    }

    def to_internal_value(self, data: Any) -> float:
        text = str(data).strip()
        if _DATE.fullmatch(text):
            try:
                day = date.fromisoformat(text)
            except ValueError:
                self.fail("invalid", value=text)
            start = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
            if start < 0:
                self.fail("invalid", value=text)
            return start + (86_400.0 - 0.001 if self.end_of_day else 0.0)
        try:
            value = float(text)
        except ValueError:
            try:
                parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                self.fail("invalid", value=text)
            if parsed.tzinfo is None:
                self.fail("invalid", value=text)
            try:
                seconds = parsed.astimezone(UTC).timestamp()
            except (OverflowError, ValueError):  # year 1 or 9999 pushed past the range
                self.fail("invalid", value=text)
            if not 0 <= seconds <= LATEST_TIMESTAMP:
                self.fail("invalid", value=text)
            return seconds
        if not math.isfinite(value) or not 0 <= value <= LATEST_TIMESTAMP:
            self.fail("invalid", value=text)
        return value

    def to_representation(self, value: Any) -> Any:
        return value


class JobListQuery(serializers.Serializer[dict[str, Any]]):
    state = serializers.ChoiceField(choices=JobState.choices, required=False)
    kind = serializers.ChoiceField(choices=JOB_KINDS, required=False)
    customer = serializers.CharField(
        required=False, max_length=64, help_text="the customer's slug (or its numeric id)"
    )
    node = serializers.CharField(
        required=False, max_length=255, help_text="jobs with a process on this node (hostname)"
    )
    gpu = serializers.CharField(
        required=False, max_length=96, help_text="jobs with a process on this GPU (NVML UUID)"
    )
    since = TimestampField(required=False, help_text="jobs last seen at or after this time")
    until = TimestampField(
        required=False, end_of_day=True, help_text="jobs first seen at or before this time"
    )
    q = serializers.CharField(
        required=False, max_length=255, help_text="part of the job id or the job name"
    )
    ordering = serializers.ChoiceField(
        choices=[*JOB_ORDERINGS, *(f"-{k}" for k in JOB_ORDERINGS)],
        required=False,
        default=DEFAULT_JOB_ORDERING,
        help_text="started, last_seen or job; prefix - for descending (default -started)",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "since" in attrs and "until" in attrs and attrs["until"] < attrs["since"]:
            raise serializers.ValidationError({"until": ["must not be before since"]})
        return attrs


class JobSeriesQuery(serializers.Serializer[dict[str, Any]]):
    signal = serializers.CharField(
        max_length=255, help_text="a signal name (docs/design.md §4), e.g. DCGM_FI_DEV_POWER_USAGE"
    )
    rank = serializers.IntegerField(required=False, min_value=0, help_text="one rank's series")
    gpu = serializers.CharField(
        required=False, max_length=96, help_text="one GPU's series (NVML UUID)"
    )
    start = TimestampField(
        required=False, help_text="default: end minus 6 h, or the job's first data"
    )
    end = TimestampField(
        required=False, end_of_day=True, help_text="default: the job's newest data"
    )
    resolution = serializers.FloatField(
        required=False,
        min_value=0.001,
        max_value=86400.0,
        help_text=(
            "bucket width in seconds (default: the finest within 10,000 points); whole hours "
            "(3600, 7200, ...) read the hourly rollups"
        ),
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "start" in attrs and "end" in attrs and attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": ["must be after start"]})
        return attrs


# --- responses -----------------------------------------------------------------------------------


class CustomerRefSerializer(serializers.Serializer[dict[str, Any]]):
    id = serializers.IntegerField()
    slug = serializers.CharField()
    name = serializers.CharField()


class PriceSerializer(serializers.Serializer[dict[str, Any]]):
    productive_share = serializers.FloatField(
        allow_null=True, help_text="compute time over GPU time (docs/pricing.md)"
    )
    gpu_hours = serializers.FloatField()
    list_price_per_gpu_hour = serializers.CharField(
        allow_null=True, help_text="the job's GPUs' list price, GPU-time weighted"
    )
    effective_price_per_productive_gpu_hour = serializers.CharField(
        allow_null=True, help_text="list cost over productive GPU-hours"
    )
    currency = serializers.CharField(allow_null=True)
    unpriced_models = serializers.ListField(child=serializers.CharField())


class JobSerializer(serializers.Serializer[dict[str, Any]]):
    job_id = serializers.CharField()
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=JobState.choices)
    kind = serializers.CharField()
    scheduler = serializers.CharField()
    customer = CustomerRefSerializer(allow_null=True)
    world_size = serializers.IntegerField(allow_null=True)
    exit_code = serializers.IntegerField(allow_null=True)
    gpu_count = serializers.IntegerField(allow_null=True)
    node_count = serializers.IntegerField(allow_null=True)
    started = serializers.DateTimeField(help_text="when Proof first saw the job")
    last_seen = serializers.DateTimeField()
    ended = serializers.DateTimeField(allow_null=True)
    duration_s = serializers.FloatField(
        allow_null=True, help_text="from its first to its newest stored data"
    )
    price = PriceSerializer()
    open_incidents = serializers.ListField(
        child=serializers.UUIDField(), help_text="public ids of its open incidents (verdicts)"
    )


class RankSerializer(serializers.Serializer[dict[str, Any]]):
    rank = serializers.IntegerField()
    local_rank = serializers.IntegerField(allow_null=True)
    node = serializers.CharField()
    gpu = serializers.CharField()
    pid = serializers.IntegerField(allow_null=True)


class JobGpuSerializer(serializers.Serializer[dict[str, Any]]):
    uuid = serializers.CharField()
    node = serializers.CharField()
    index = serializers.IntegerField(allow_null=True)
    model = serializers.CharField()


class JobDetailSerializer(JobSerializer):
    ranks = RankSerializer(many=True)
    gpus = JobGpuSerializer(many=True)
    nodes = serializers.ListField(child=serializers.CharField())
    data_start = serializers.FloatField(allow_null=True)
    data_end = serializers.FloatField(allow_null=True)


class SignalSeriesSerializer(serializers.Serializer[dict[str, Any]]):
    rank = serializers.IntegerField(allow_null=True)
    gpu = serializers.CharField()
    gpu_index = serializers.IntegerField(allow_null=True)
    node = serializers.CharField()
    pid = serializers.IntegerField(allow_null=True)
    labels = serializers.DictField(child=serializers.CharField())
    t = serializers.ListField(
        child=serializers.FloatField(), help_text="each bucket's start (seconds since epoch)"
    )
    mean = serializers.ListField(child=serializers.FloatField())
    min = serializers.ListField(child=serializers.FloatField())
    max = serializers.ListField(child=serializers.FloatField())
    count = serializers.ListField(child=serializers.IntegerField())


class JobSeriesSerializer(serializers.Serializer[dict[str, Any]]):
    job = serializers.CharField()
    signal = serializers.CharField()
    unit = serializers.CharField()
    start = serializers.FloatField()
    end = serializers.FloatField()
    resolution = serializers.FloatField()
    data_source = serializers.ChoiceField(
        choices=["raw samples", "hourly rollups"],
        help_text="hourly rollups when the resolution is whole hours",
    )
    points = serializers.IntegerField(help_text="buckets returned, over all series")
    series = SignalSeriesSerializer(many=True)
