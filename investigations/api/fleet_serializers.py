"""Shapes of the fleet API (investigations/api/fleet.py): query parameters and responses."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from investigations.selectors_fleet import GPU_HEALTH, NODE_STATES
from investigations.selectors_health import MAX_DAYS


class NodeListQuery(serializers.Serializer[dict[str, Any]]):
    state = serializers.ChoiceField(
        choices=NODE_STATES,
        required=False,
        help_text="reporting: its agent was heard from in the last 10 minutes; else silent",
    )
    model = serializers.CharField(
        required=False, max_length=128, help_text="nodes with a GPU of this model"
    )


class GpuListQuery(serializers.Serializer[dict[str, Any]]):
    node = serializers.CharField(required=False, max_length=255, help_text="the node's hostname")
    model = serializers.CharField(required=False, max_length=128)
    health = serializers.ChoiceField(choices=GPU_HEALTH, required=False)


class FleetHealthQuery(serializers.Serializer[dict[str, Any]]):
    days = serializers.IntegerField(
        required=False, default=3, min_value=1, max_value=MAX_DAYS, help_text="trend length"
    )
    page = serializers.IntegerField(
        required=False, default=1, min_value=1, max_value=1_000_000, help_text="25 GPUs a page"
    )


class NodeGpuSerializer(serializers.Serializer[dict[str, Any]]):
    uuid = serializers.CharField()
    index = serializers.IntegerField(allow_null=True)
    model = serializers.CharField()


class NodeSerializer(serializers.Serializer[dict[str, Any]]):
    hostname = serializers.CharField()
    state = serializers.ChoiceField(choices=NODE_STATES)
    last_seen = serializers.DateTimeField(allow_null=True)
    registered_at = serializers.DateTimeField(allow_null=True)
    agent_version = serializers.CharField()
    gpus = NodeGpuSerializer(many=True)


class CurrentJobSerializer(serializers.Serializer[dict[str, Any]]):
    job_id = serializers.CharField()
    customer = serializers.CharField(allow_null=True, help_text="the customer's name")


class GpuSerializer(serializers.Serializer[dict[str, Any]]):
    uuid = serializers.CharField()
    index = serializers.IntegerField(allow_null=True)
    model = serializers.CharField()
    memory_mib = serializers.IntegerField(allow_null=True)
    driver_version = serializers.CharField()
    cuda_version = serializers.CharField()
    node = serializers.CharField()
    last_seen = serializers.DateTimeField(
        allow_null=True, help_text="when its node's agent was last heard from"
    )
    health = serializers.ChoiceField(
        choices=GPU_HEALTH,
        help_text=(
            "silent: its node does not report; fault: an open hardware_fault; degrading: an "
            "open gpu_degrading; incident: another open infrastructure incident on it or its "
            "node; ok"
        ),
    )
    incidents = serializers.ListField(
        child=serializers.CharField(),
        help_text="families of the open infrastructure incidents on it or its node",
    )
    current_job = CurrentJobSerializer(allow_null=True, help_text="the job holding it now")


class SignSerializer(serializers.Serializer[dict[str, Any]]):
    signal = serializers.CharField()
    observed = serializers.JSONField()
    baseline = serializers.JSONField()
    note = serializers.CharField()


class AtRiskIncidentSerializer(serializers.Serializer[dict[str, Any]]):
    id = serializers.UUIDField()
    family = serializers.CharField()
    title = serializers.CharField()
    confidence = serializers.FloatField()
    first_seen = serializers.DateTimeField()
    last_seen = serializers.DateTimeField()
    recommendation = serializers.CharField()
    job = serializers.CharField(allow_null=True)
    signs = SignSerializer(many=True)


class TrendSerializer(serializers.Serializer[dict[str, Any]]):
    signal = serializers.CharField(help_text="what the evidence cited")
    label = serializers.CharField()  # type: ignore[assignment]
    unit = serializers.CharField()
    first = serializers.FloatField(allow_null=True)
    last = serializers.FloatField(allow_null=True)
    increase = serializers.FloatField(
        allow_null=True, help_text="over the days asked (events: how many)"
    )
    last_day = serializers.FloatField(allow_null=True, help_text="over the last 24 h")
    t = serializers.ListField(child=serializers.FloatField(), help_text="hour starts")
    values = serializers.ListField(child=serializers.FloatField(allow_null=True))


class AtRiskGpuSerializer(serializers.Serializer[dict[str, Any]]):
    rank = serializers.IntegerField(help_text="1-based position in the drain advice")
    gpu = serializers.CharField()
    node = serializers.CharField()
    index = serializers.IntegerField(allow_null=True)
    model = serializers.CharField()
    tier = serializers.IntegerField(
        help_text="1 drain now, 2 drain at the next job boundary, 3 schedule diagnostics"
    )
    action = serializers.CharField()
    why = serializers.CharField()
    confidence = serializers.FloatField()
    last_seen = serializers.DateTimeField()
    running_job = serializers.CharField(allow_null=True)
    running_customer = serializers.CharField(allow_null=True)
    incidents = AtRiskIncidentSerializer(many=True)
    trends = TrendSerializer(many=True)


class HealthSummarySerializer(serializers.Serializer[dict[str, Any]]):
    gpus = serializers.IntegerField()
    failing = serializers.IntegerField()
    degrading = serializers.IntegerField()
    nodes = serializers.IntegerField()


class FleetHealthSerializer(serializers.Serializer[dict[str, Any]]):
    summary = HealthSummarySerializer()
    gpus = AtRiskGpuSerializer(many=True)
    page = serializers.IntegerField()
    pages = serializers.IntegerField()
    days = serializers.IntegerField()
