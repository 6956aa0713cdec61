from __future__ import annotations

from typing import Any

from rest_framework import serializers

from notify.models import ChannelKind, NotificationChannel, OutboxDelivery, RoutingRule


class RoutingRuleSerializer(serializers.ModelSerializer[RoutingRule]):
    families = serializers.ListField(child=serializers.CharField(max_length=64), required=False)
    categories = serializers.ListField(child=serializers.CharField(max_length=32), required=False)
    customer = serializers.IntegerField(source="customer_id", required=False, allow_null=True)

    class Meta:
        model = RoutingRule
        fields = ["families", "categories", "customer", "min_gpu_hours_lost", "min_money_lost"]


def masked(target: str) -> str:
    """An incoming-webhook URL or routing key is itself a credential: reads show its end."""
    if len(target) <= 8:
        return "…" if target else ""
    return "…" + target[-4:]


class ChannelSerializer(serializers.ModelSerializer[NotificationChannel]):
    rules = RoutingRuleSerializer(many=True, read_only=True)
    target = serializers.SerializerMethodField()

    class Meta:
        model = NotificationChannel
        fields = [
            "id",
            "name",
            "kind",
            "target",
            "addresses",
            "enabled",
            "disabled_reason",
            "rules",
            "created_at",
            "updated_at",
        ]

    def get_target(self, channel: NotificationChannel) -> str:
        return masked(channel.target)


class ChannelCreatedSerializer(ChannelSerializer):
    """The 201 of a new channel: a webhook channel's signing secret is in it, this once."""

    # Not read_only: the schema would then make it required, and only webhooks have one.
    secret = serializers.CharField(
        required=False, help_text="webhook channels only: the signing secret"
    )

    class Meta(ChannelSerializer.Meta):
        fields = [*ChannelSerializer.Meta.fields, "secret"]


class RotatedSecretSerializer(serializers.Serializer[Any]):
    secret = serializers.CharField(help_text="the new signing secret, shown this once")
    previous_valid_for_s = serializers.IntegerField(
        help_text="seconds the previous secret still signs (both are sent meanwhile)"
    )


class RuleWriteSerializer(serializers.Serializer[Any]):
    families = serializers.ListField(child=serializers.CharField(max_length=64), required=False)
    categories = serializers.ListField(child=serializers.CharField(max_length=32), required=False)
    customer = serializers.IntegerField(required=False, allow_null=True)
    min_gpu_hours_lost = serializers.FloatField(required=False, allow_null=True, min_value=0)
    min_money_lost = serializers.DecimalField(
        max_digits=14, decimal_places=2, required=False, allow_null=True, min_value=0
    )


class ChannelWriteSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=200)
    kind = serializers.ChoiceField(choices=ChannelKind.choices)
    target = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    addresses = serializers.ListField(child=serializers.EmailField(), required=False, default=list)
    enabled = serializers.BooleanField(required=False, default=True)
    rules = RuleWriteSerializer(many=True, required=False, default=list)


class ChannelUpdateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=200, required=False)
    target = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    addresses = serializers.ListField(child=serializers.EmailField(), required=False)
    enabled = serializers.BooleanField(required=False)
    rules = RuleWriteSerializer(many=True, required=False)


class DeliverySerializer(serializers.ModelSerializer[OutboxDelivery]):
    incident = serializers.SerializerMethodField()

    class Meta:
        model = OutboxDelivery
        fields = [
            "id",
            "kind",
            "incident",
            "event_id",
            "state",
            "attempts",
            "next_attempt_at",
            "last_status",
            "last_error",
            "created_at",
            "sent_at",
        ]

    def get_incident(self, row: OutboxDelivery) -> str | None:
        return str(row.incident.public_id) if row.incident is not None else None
