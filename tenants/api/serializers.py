"""Shapes of the tenancy API. Writes go through tenants/services.py, never serializer.save()."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from tenants.models import AgentToken, ApiToken, Customer, JobMappingRule, MatchField, TokenScope


class CustomerSerializer(serializers.ModelSerializer[Customer]):
    class Meta:
        model = Customer
        fields = ["id", "name", "slug", "created_at"]
        read_only_fields = fields


class CustomerCreateSerializer(serializers.Serializer[dict[str, Any]]):
    name = serializers.CharField(max_length=200)
    slug = serializers.SlugField(max_length=64)


class ApiTokenSerializer(serializers.ModelSerializer[ApiToken]):
    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "customer",
            "role",
            "scope",
            "created_at",
            "expires_at",
            "revoked_at",
            "last_used_at",
            "rate_limit",
        ]
        read_only_fields = fields


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    """The 201 of a new token: its read shape and, in this one response only, the plaintext."""

    token = serializers.CharField(read_only=True, help_text="the secret: shown this once")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


# What a new token's scope may be given as: a stored name, or "write" for read_write.
TOKEN_SCOPE_INPUT_CHOICES = [*TokenScope.choices, ("write", "Read and write (= read_write)")]


class ApiTokenCreateSerializer(serializers.Serializer[dict[str, Any]]):
    name = serializers.CharField(max_length=200)
    scope = serializers.ChoiceField(
        choices=TOKEN_SCOPE_INPUT_CHOICES,
        default=TokenScope.READ,
        help_text="read; write (stored as read_write); admin (admin roles only: the admin "
        "endpoints too)",
    )
    # `source`: the services take the customer as `customer_id`.
    customer = serializers.IntegerField(
        required=False, allow_null=True, default=None, source="customer_id"
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    rate_limit = serializers.RegexField(
        r"^([1-9][0-9]{0,6}/(s|sec|second|m|min|minute|h|hour|d|day))?$",
        max_length=32,
        required=False,
        allow_blank=True,
        default="",
        help_text="this token's request rate, e.g. '120/min'; empty: the server default",
    )


class AgentTokenSerializer(serializers.ModelSerializer[AgentToken]):
    class Meta:
        model = AgentToken
        fields = ["id", "name", "prefix", "created_at", "revoked_at", "last_used_at"]
        read_only_fields = fields


class AgentTokenCreatedSerializer(AgentTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="the secret: shown this once")

    class Meta(AgentTokenSerializer.Meta):
        fields = [*AgentTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class AgentTokenCreateSerializer(serializers.Serializer[dict[str, Any]]):
    name = serializers.CharField(max_length=200)


class JobMappingRuleSerializer(serializers.ModelSerializer[JobMappingRule]):
    class Meta:
        model = JobMappingRule
        fields = ["id", "match_field", "value", "customer", "priority", "created_at"]
        read_only_fields = fields


class JobMappingRuleWriteSerializer(serializers.Serializer[dict[str, Any]]):
    match_field = serializers.ChoiceField(choices=MatchField.choices)
    value = serializers.CharField(max_length=255)
    customer = serializers.IntegerField(source="customer_id")
    priority = serializers.IntegerField(default=100)
