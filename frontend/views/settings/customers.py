"""/settings/customers/ and /settings/rules/: the operator's customers and the rules that
attribute jobs to them (operator admins only)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods, require_POST

from frontend.access import console_view
from frontend.forms.settings import CustomerForm, MappingRuleForm
from frontend.selectors.settings import (
    customer_choices,
    customers_page,
    masks_node_names,
    page_number,
    rules_page,
)
from frontend.views.settings.common import (
    add_service_error,
    answers_bad_parameters,
    render_settings,
)
from tenants.access import Principal, get_object_for_tenant
from tenants.models import JobMappingRule
from tenants.services import (
    TenancyError,
    do_create_customer,
    do_create_mapping_rule,
    do_delete_mapping_rule,
    do_set_mask_node_names,
    do_update_mapping_rule,
)

# The services' messages: "a rule matching …"/"the rule's value …", "customer … does not exist",
# "priority … must be an integer".
RULE_ERROR_FIELDS = {"value": "rule", "customer": "customer", "priority": "priority"}


@require_http_methods(["GET", "POST"])
@console_view(operator_only=True, admin_only=True)
@answers_bad_parameters
def customers(request: HttpRequest, principal: Principal) -> HttpResponse:
    form = CustomerForm(request.POST if request.method == "POST" else None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                customer = do_create_customer(principal, **form.cleaned_data)
            except TenancyError as exc:
                add_service_error(form, exc, {"slug": "slug", "name": "name"})
            else:
                messages.success(request, f"Customer “{customer.name}” created.")
                return redirect("settings-customers")
        status = 400
    page = customers_page(principal, page_number(request.GET.get("page")))
    return render_settings(
        request,
        principal,
        "customers.html",
        {"page": page, "form": form, "mask_node_names": masks_node_names(principal)},
        page="settings-customers",
        status=status,
    )


@require_POST
@console_view(operator_only=True, admin_only=True)
def customer_masking(request: HttpRequest, principal: Principal) -> HttpResponse:
    """Whether customers' verdict summaries and share links alias node names and GPU UUIDs."""
    mask = request.POST.get("mask_node_names") == "on"
    do_set_mask_node_names(principal, mask=mask)
    messages.success(
        request,
        "Customer summaries and share links now show "
        + ("aliases (node-1, gpu-1) instead of node names." if mask else "node names as stored."),
    )
    return redirect("settings-customers")


@require_http_methods(["GET", "POST"])
@console_view(operator_only=True, admin_only=True)
@answers_bad_parameters
def rules(request: HttpRequest, principal: Principal) -> HttpResponse:
    choices = customer_choices(principal)
    form = MappingRuleForm(request.POST if request.method == "POST" else None, customers=choices)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            try:
                rule = do_create_mapping_rule(
                    principal,
                    match_field=data["match_field"],
                    value=data["value"],
                    customer_id=data["customer"],
                    priority=data["priority"],
                )
            except TenancyError as exc:
                add_service_error(form, exc, RULE_ERROR_FIELDS)
            else:
                messages.success(request, f"Rule {rule.match_field}={rule.value} created.")
                return redirect("settings-rules")
        status = 400
    page = rules_page(principal, page_number(request.GET.get("page")))
    return render_settings(
        request,
        principal,
        "rules.html",
        {"page": page, "form": form, "has_customers": bool(choices)},
        page="settings-rules",
        status=status,
    )


@require_http_methods(["GET", "POST"])
@console_view(operator_only=True, admin_only=True)
def rule_edit(request: HttpRequest, principal: Principal, rule_id: int) -> HttpResponse:
    rule = get_object_for_tenant(JobMappingRule, principal, pk=rule_id)
    choices = customer_choices(principal)
    initial = {
        "match_field": rule.match_field,
        "value": rule.value,
        "customer": rule.customer_id,
        "priority": rule.priority,
    }
    form = MappingRuleForm(
        request.POST if request.method == "POST" else None, initial=initial, customers=choices
    )
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            try:
                do_update_mapping_rule(
                    principal,
                    rule.pk,
                    match_field=data["match_field"],
                    value=data["value"],
                    customer_id=data["customer"],
                    priority=data["priority"],
                )
            except TenancyError as exc:
                add_service_error(form, exc, RULE_ERROR_FIELDS)
            else:
                messages.success(request, f"Rule {data['match_field']}={data['value']} saved.")
                return redirect("settings-rules")
        status = 400
    return render_settings(
        request,
        principal,
        "rule_edit.html",
        {"rule": rule, "form": form},
        page="settings-rules",
        status=status,
    )


@require_POST
@console_view(operator_only=True, admin_only=True)
def rule_delete(request: HttpRequest, principal: Principal, rule_id: int) -> HttpResponse:
    rule = get_object_for_tenant(JobMappingRule, principal, pk=rule_id)
    do_delete_mapping_rule(principal, rule.pk)
    messages.success(
        request,
        f"Rule {rule.match_field}={rule.value} deleted; jobs already attributed keep their "
        "customer.",
    )
    return redirect("settings-rules")
