from __future__ import annotations

from decimal import Decimal
from typing import Any

from rest_framework import serializers

from investigations.models import GpuListPrice, Incident, VerdictRevision


class IncidentSerializer(serializers.ModelSerializer[Incident]):
    id = serializers.UUIDField(source="public_id", read_only=True)
    job = serializers.SerializerMethodField()

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
            "verdict",
        ]
        read_only_fields = fields

    def get_job(self, incident: Incident) -> str | None:
        return incident.job.job_id if incident.job is not None else None


class VerdictRevisionSerializer(serializers.ModelSerializer[VerdictRevision]):
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


class RealPriceQuerySerializer(serializers.Serializer[dict[str, Any]]):
    job = serializers.CharField(required=False, help_text="a scheduler job id")
    customer = serializers.IntegerField(required=False)
    gpu = serializers.CharField(required=False, help_text="a GPU UUID")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if len(attrs) > 1:
            raise serializers.ValidationError("pass at most one of job, customer, gpu")
        return attrs
