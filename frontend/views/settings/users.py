"""/settings/users/: members and their roles: invite (a one-time set-password link shown to
the inviting admin), change role, deactivate/reactivate, issue a new link. Operator admins
manage every member of the operator, customer admins their own customer's members."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse, reverse_lazy
from django.views.decorators.http import require_http_methods, require_POST

from frontend.access import console_view
from frontend.forms.settings import InviteForm, MemberRoleForm
from frontend.selectors.settings import customer_choices, member, members_page, page_number
from frontend.views.settings.common import (
    add_service_error,
    answers_bad_parameters,
    no_store,
    render_settings,
    show_secret_once,
    take_secret,
)
from tenants.access import Principal
from tenants.models import Membership
from tenants.services import (
    PasswordLink,
    TenancyError,
    do_change_member_role,
    do_invite_member,
    do_issue_password_link,
    do_set_member_active,
)

# The services' messages: "the username …", "username … is not valid", "a user named …",
# "email address … is not valid", "customer … does not exist", "role … must be one of …".
MEMBER_ERROR_FIELDS = {
    "username": "user",
    "email": "email",
    "customer": "customer",
    "role": "role",
}


def _keep_link(request: HttpRequest, membership: Membership, link: PasswordLink) -> None:
    url = request.build_absolute_uri(
        reverse("password_set", kwargs={"uidb64": link.uidb64, "token": link.token})
    )
    show_secret_once(request, kind="link", label=membership.user.get_username(), value=url)


@require_http_methods(["GET", "POST"])
@console_view(admin_only=True)
@answers_bad_parameters
def users(request: HttpRequest, principal: Principal) -> HttpResponse:
    choices = customer_choices(principal) if principal.is_operator else []
    form = InviteForm(
        request.POST if request.method == "POST" else None, principal=principal, customers=choices
    )
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            try:
                membership, link = do_invite_member(
                    principal,
                    username=data["username"],
                    email=data["email"],
                    role=data["role"],
                    customer_id=form.customer_id(),
                )
            except TenancyError as exc:
                add_service_error(form, exc, MEMBER_ERROR_FIELDS)
            else:
                _keep_link(request, membership, link)
                messages.success(request, f"{membership.user.get_username()} invited.")
                return redirect("settings-users")
        status = 400
    page = members_page(principal, page_number(request.GET.get("page")))
    secret = take_secret(request, "link")
    response = render_settings(
        request,
        principal,
        "users.html",
        {"page": page, "form": form, "secret": secret},
        page="settings-users",
        status=status,
    )
    return no_store(response) if secret else response


@require_http_methods(["GET", "POST"])
@console_view(admin_only=True)
def user_edit(request: HttpRequest, principal: Principal, member_id: int) -> HttpResponse:
    membership = member(principal, member_id)
    if membership is None:
        raise Http404("No such member.")
    choices = customer_choices(principal) if principal.is_operator else []
    initial = {"role": membership.role, "customer": membership.customer_id or ""}
    form = MemberRoleForm(
        request.POST if request.method == "POST" else None,
        initial=initial,
        principal=principal,
        customers=choices,
    )
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                changed = do_change_member_role(
                    principal,
                    membership.pk,
                    role=form.cleaned_data["role"],
                    customer_id=form.customer_id(),
                )
            except TenancyError as exc:
                add_service_error(form, exc, MEMBER_ERROR_FIELDS)
            else:
                messages.success(
                    request,
                    f"{membership.user.get_username()} is now {changed.get_role_display()}.",
                )
                return redirect("settings-users")
        status = 400
    return render_settings(
        request,
        principal,
        "user_edit.html",
        {"member": membership, "form": form, "is_self": membership.user_id == principal.user_id},
        page="settings-users",
        status=status,
    )


@require_POST
@console_view(admin_only=True)
def user_active(request: HttpRequest, principal: Principal, member_id: int) -> HttpResponse:
    active = request.POST.get("active")
    if active not in ("0", "1"):
        messages.error(request, "active: must be 0 (deactivate) or 1 (reactivate).")
        return redirect("settings-users")
    try:
        membership = do_set_member_active(principal, member_id, active=active == "1")
    except TenancyError as exc:
        messages.error(request, f"Not changed: {exc}.")
    else:
        name = membership.user.get_username()
        if active == "1":
            messages.success(request, f"{name} reactivated: they can sign in again.")
        else:
            messages.success(
                request,
                f"{name} deactivated: they can no longer sign in, and the API tokens they "
                "created are revoked.",
            )
    return redirect("settings-users")


@require_POST
@console_view(admin_only=True)
def user_link(request: HttpRequest, principal: Principal, member_id: int) -> HttpResponse:
    try:
        membership, link = do_issue_password_link(principal, member_id)
    except TenancyError as exc:
        messages.error(request, f"No link issued: {exc}.")
    else:
        _keep_link(request, membership, link)
        messages.success(
            request,
            f"New set-password link for {membership.user.get_username()}: their old password "
            "and any earlier link no longer work.",
        )
    return redirect("settings-users")


class PasswordSetView(auth_views.PasswordResetConfirmView):
    """Where an invited member (or one given a new link) chooses their password. Django's
    password-reset confirmation: the link works once, until another is issued, and for
    PASSWORD_RESET_TIMEOUT (3 days by default)."""

    template_name = "proof/console/settings/password_set.html"
    success_url = reverse_lazy("password_set_done")


class PasswordSetDoneView(auth_views.PasswordResetCompleteView):
    template_name = "proof/console/settings/password_set_done.html"
