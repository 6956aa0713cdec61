"""Forms of the settings pages: they check the shape of what was posted (required, lengths,
formats, choices); the services (tenants.services, investigations.services) check what the
principal may do and what already exists, and their refusals come back as field errors."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Any

from django import forms
from django.core.validators import MinValueValidator
from django.utils import timezone

from tenants.access import Principal
from tenants.models import CUSTOMER_ROLES, OPERATOR_ROLES, MatchField, Role, TokenScope

OPERATOR_WIDE = ""  # the customer choice of an operator-wide token or role


class CustomerForm(forms.Form):
    name = forms.CharField(max_length=200)
    slug = forms.SlugField(
        max_length=64, help_text="Letters, digits, hyphens, underscores; unique in your fleet."
    )


class MappingRuleForm(forms.Form):
    match_field = forms.ChoiceField(label="Match", choices=MatchField.choices)
    value = forms.CharField(max_length=255)
    customer = forms.TypedChoiceField(coerce=int)
    priority = forms.IntegerField(
        initial=100,
        min_value=-1_000_000,
        max_value=1_000_000,
        help_text="Lowest first; ties go to the older rule.",
    )

    def __init__(self, *args: Any, customers: list[tuple[int, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["customer"].choices = customers  # type: ignore[attr-defined]


class AgentTokenForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="Where it is installed, e.g. “rack 12”.")


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=200)
    scope = forms.ChoiceField(choices=TokenScope.choices, initial=TokenScope.READ)
    customer = forms.ChoiceField(
        required=False, help_text="Operator-wide, or one customer's jobs only."
    )
    expires_on = forms.DateField(
        required=False,
        label="Expires on",
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="Optional; the token stops working at the start of that day (UTC).",
    )

    def __init__(
        self, *args: Any, principal: Principal, customers: list[tuple[int, str]], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if principal.is_operator:
            self.fields["customer"].choices = [  # type: ignore[attr-defined]
                (OPERATOR_WIDE, "Operator-wide"),
                *((str(pk), name) for pk, name in customers),
            ]
        else:
            del self.fields["customer"]  # a customer admin's tokens are its customer's

    def clean_expires_on(self) -> date | None:
        day: date | None = self.cleaned_data.get("expires_on")
        if day is not None and day <= timezone.now().date():
            raise forms.ValidationError("must be a day after today")
        return day

    def customer_id(self) -> int | None:
        raw = self.cleaned_data.get("customer", OPERATOR_WIDE)
        return None if raw in (OPERATOR_WIDE, None) else int(raw)


class ListPriceForm(forms.Form):
    gpu_model = forms.CharField(
        label="GPU model", max_length=128, help_text="The model name as NVML reports it."
    )
    price_per_gpu_hour = forms.DecimalField(
        label="Price per GPU-hour",
        max_digits=10,
        decimal_places=4,
        validators=[MinValueValidator(Decimal("0.0001"))],
    )
    currency = forms.CharField(
        min_length=3, max_length=3, initial="USD", help_text="ISO 4217 code, e.g. USD."
    )

    def clean_currency(self) -> str:
        currency: str = self.cleaned_data["currency"].strip().upper()
        if not currency.isalpha():
            raise forms.ValidationError("must be three letters, e.g. USD")
        return currency


class ListPriceEditForm(ListPriceForm):
    """The price of one model; the model itself is the row's identity and is not edited."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        del self.fields["gpu_model"]


def role_choices(principal: Principal) -> list[tuple[str, str]]:
    """The roles an admin may give: never above its own scope."""
    allowed = CUSTOMER_ROLES if principal.is_customer else (OPERATOR_ROLES | CUSTOMER_ROLES)
    return [(role.value, role.label) for role in Role if role in allowed]


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField()
    customer = forms.ChoiceField(
        required=False, help_text="Customer roles only: the customer whose jobs they see."
    )

    def __init__(
        self, *args: Any, principal: Principal, customers: list[tuple[int, str]], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["role"].choices = role_choices(principal)  # type: ignore[attr-defined]
        if principal.is_operator:
            self.fields["customer"].choices = [  # type: ignore[attr-defined]
                (OPERATOR_WIDE, "— (operator roles)"),
                *((str(pk), name) for pk, name in customers),
            ]
        else:
            del self.fields["customer"]  # a customer admin's members are its customer's

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean() or {}
        if "customer" not in self.fields or "role" not in cleaned:
            return cleaned
        role, customer = Role(cleaned["role"]), cleaned.get("customer", OPERATOR_WIDE)
        if role in CUSTOMER_ROLES and customer == OPERATOR_WIDE:
            self.add_error("customer", f"{role.label} is a customer role: pick the customer")
        if role in OPERATOR_ROLES and customer != OPERATOR_WIDE:
            self.add_error("customer", f"{role.label} is an operator role: leave it empty")
        return cleaned

    def customer_id(self) -> int | None:
        raw = self.cleaned_data.get("customer", OPERATOR_WIDE)
        return None if raw in (OPERATOR_WIDE, None) else int(raw)


class InviteForm(MemberRoleForm):
    username = forms.CharField(max_length=150, help_text="What they sign in with.")
    email = forms.EmailField(required=False)
    field_order = ["username", "email", "role", "customer"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order_fields(self.field_order)
        self.fields["role"].initial = Role.CUSTOMER_VIEWER  # the least, unless chosen
