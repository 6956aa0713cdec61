"""The staff admin site for tenancy data.

The admin is Proof staff's cross-tenant tool; its requests run in system_context()
(tenants/middleware.py), so row-level security lets staff see every operator's rows. Adding
an operator here also creates its first operator admin, through the same service as
`manage.py create_operator`. Token secrets are never editable: API tokens are created by
their owners (console/API); agent tokens created here are shown once in a message.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.password_validation import validate_password
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from tenants import services
from tenants.models import AgentToken, ApiToken, Customer, JobMappingRule, Membership, Operator


class OperatorCreationForm(forms.ModelForm[Operator]):
    admin_username = forms.CharField(max_length=150, help_text="The first operator admin.")
    admin_email = forms.EmailField(required=False)
    admin_password = forms.CharField(widget=forms.PasswordInput, strip=False)

    class Meta:
        model = Operator
        fields = ["name", "slug"]

    def clean_admin_password(self) -> str:
        password: str = self.cleaned_data["admin_password"]
        validate_password(password)
        return password


@admin.register(Operator)
class OperatorAdmin(admin.ModelAdmin[Operator]):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = OperatorCreationForm
            kwargs["fields"] = [
                "name",
                "slug",
                "admin_username",
                "admin_email",
                "admin_password",
            ]
        return super().get_form(request, obj, change=change, **kwargs)

    def save_model(self, request: HttpRequest, obj: Operator, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        data = form.cleaned_data
        try:
            operator, _user = services.do_create_operator(
                name=data["name"],
                slug=data["slug"],
                admin_username=data["admin_username"],
                admin_email=data.get("admin_email") or "",
                admin_password=data["admin_password"],
            )
        except services.TenancyError as exc:
            # Reaches here only on a race (the form validated uniqueness); say so plainly.
            messages.error(request, str(exc))
            raise
        obj.pk, obj.created_at = operator.pk, operator.created_at
        obj._state.adding, obj._state.db = False, operator._state.db


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin[Customer]):
    list_display = ["name", "slug", "operator", "created_at"]
    list_filter = ["operator"]
    search_fields = ["name", "slug"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin[Membership]):
    list_display = ["user", "role", "operator", "customer", "created_at"]
    list_filter = ["role", "operator"]
    raw_id_fields = ["user"]


def _revoke(queryset: QuerySet[Any]) -> int:
    return int(queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now()))


@admin.action(description="Revoke selected tokens")
def revoke_tokens(
    modeladmin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Any]
) -> None:
    count = _revoke(queryset)
    modeladmin.message_user(request, f"Revoked {count} token(s).")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    list_display = ["name", "prefix", "operator", "customer", "role", "scope", "expires_at"]
    list_filter = ["operator", "scope", "role"]
    readonly_fields = [
        "operator",
        "customer",
        "name",
        "role",
        "scope",
        "prefix",
        "created_by",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    ]
    exclude = ["token_hash"]
    actions = [revoke_tokens]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class AgentTokenCreationForm(forms.ModelForm[AgentToken]):
    class Meta:
        model = AgentToken
        fields = ["operator", "name"]


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin[AgentToken]):
    list_display = ["name", "prefix", "operator", "created_at", "revoked_at", "last_used_at"]
    list_filter = ["operator"]
    actions = [revoke_tokens]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = AgentTokenCreationForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return []
        return ["operator", "name", "prefix", "created_by", "created_at", "last_used_at"]

    def get_exclude(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["token_hash"] if obj is not None else []

    def save_model(self, request: HttpRequest, obj: AgentToken, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        token, plaintext = services.do_create_agent_token(
            obj.operator_id, name=obj.name, created_by_id=request.user.pk
        )
        obj.pk, obj.prefix, obj.token_hash = token.pk, token.prefix, token.token_hash
        obj.created_at = token.created_at
        obj._state.adding, obj._state.db = False, token._state.db
        messages.warning(
            request,
            f"Agent token for {token.operator}: {plaintext} — copy it now, it is not shown again.",
        )


class JobMappingRuleForm(forms.ModelForm[JobMappingRule]):
    class Meta:
        model = JobMappingRule
        fields = ["operator", "match_field", "value", "customer", "priority"]

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean() or {}
        operator, customer = data.get("operator"), data.get("customer")
        if operator is not None and customer is not None and customer.operator_id != operator.pk:
            raise forms.ValidationError("The customer belongs to another operator.")
        return data


@admin.register(JobMappingRule)
class JobMappingRuleAdmin(admin.ModelAdmin[JobMappingRule]):
    form = JobMappingRuleForm
    list_display = ["operator", "match_field", "value", "customer", "priority"]
    list_filter = ["operator", "match_field"]
