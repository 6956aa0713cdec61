"""/settings/prices/: what the operator charges per GPU-hour for each GPU model, the list
price the real price (/price/) starts from (operator admins only)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods, require_POST

from frontend.access import console_view
from frontend.forms.settings import ListPriceEditForm, ListPriceForm
from frontend.selectors.settings import price_rows
from frontend.views.settings.common import add_service_error, render_settings
from investigations.models import GpuListPrice
from investigations.services import delete_list_price, set_list_price
from tenants.access import Principal, get_object_for_tenant
from tenants.services import TenancyError

PRICE_ERROR_FIELDS = {
    "gpu_model": "gpu_model",
    "price_per_gpu_hour": "price",
    "currency": "currency",
}


@require_http_methods(["GET", "POST"])
@console_view(operator_only=True, admin_only=True)
def prices(request: HttpRequest, principal: Principal) -> HttpResponse:
    form = ListPriceForm(
        request.POST if request.method == "POST" else None,
        initial={"gpu_model": request.GET.get("gpu_model", "")},
    )
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                price = set_list_price(principal, **form.cleaned_data)
            except TenancyError as exc:
                add_service_error(form, exc, PRICE_ERROR_FIELDS)
            else:
                messages.success(
                    request,
                    f"{price.gpu_model}: {price.price_per_gpu_hour} {price.currency} per GPU-hour.",
                )
                return redirect("settings-prices")
        status = 400
    return render_settings(
        request,
        principal,
        "prices.html",
        {"rows": price_rows(principal), "form": form},
        page="settings-prices",
        status=status,
    )


@require_http_methods(["GET", "POST"])
@console_view(operator_only=True, admin_only=True)
def price_edit(request: HttpRequest, principal: Principal, price_id: int) -> HttpResponse:
    price = get_object_for_tenant(GpuListPrice, principal, pk=price_id)
    form = ListPriceEditForm(
        request.POST if request.method == "POST" else None,
        initial={"price_per_gpu_hour": price.price_per_gpu_hour, "currency": price.currency},
    )
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                price = set_list_price(principal, gpu_model=price.gpu_model, **form.cleaned_data)
            except TenancyError as exc:
                add_service_error(form, exc, PRICE_ERROR_FIELDS)
            else:
                messages.success(
                    request,
                    f"{price.gpu_model}: {price.price_per_gpu_hour} {price.currency} per GPU-hour.",
                )
                return redirect("settings-prices")
        status = 400
    return render_settings(
        request,
        principal,
        "price_edit.html",
        {"price": price, "form": form},
        page="settings-prices",
        status=status,
    )


@require_POST
@console_view(operator_only=True, admin_only=True)
def price_delete(request: HttpRequest, principal: Principal, price_id: int) -> HttpResponse:
    price = get_object_for_tenant(GpuListPrice, principal, pk=price_id)
    delete_list_price(principal, price.pk)
    messages.success(
        request,
        f"List price of {price.gpu_model} deleted: its jobs have no price until one is set.",
    )
    return redirect("settings-prices")
