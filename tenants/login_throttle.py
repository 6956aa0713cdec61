"""Sign-in throttling and lockout, for the console's /login/ and the staff admin's /admin/login/
(docs/tenancy.md "Sign-in throttling").

Failed sign-ins are counted per account (the username as typed, lower-cased, so an unknown name
is throttled exactly like a known one and the lockout tells nobody which accounts exist) and per
client address, in fixed windows of PROOF_LOGIN_WINDOW_S. Reaching PROOF_LOGIN_MAX_FAILURES for
the account, or PROOF_LOGIN_MAX_ADDRESS_FAILURES for the address, locks it for
PROOF_LOGIN_LOCKOUT_S: every attempt then is refused before the password is checked (so the
right password does not get in, and a guesser costs no password hash), with HTTP 429 and a
Retry-After. A success clears the account's count, not the address's (one valid account must not
reset the count of an address that is guessing others). The state lives in the Django cache:
Redis in production, so all web processes share it; the local-memory cache in the embedded
default (one process).

Each failure, each lockout and each success of a user with a membership leaves an AuditEvent
in their operator's log (actor: the username; detail: the address and which sign-in page).
Attempts refused while locked are not audited, one by one, so a guesser cannot flood the log;
they are logged.

The forms carry the check (a form is the one place both login views let us hook, and it has the
request); `throttled_login` turns a refusal into the 429 on the way out.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import cache
from django.http import HttpRequest, HttpResponseBase

from tenants.audit import record_audit
from tenants.context import tenant_context
from tenants.selectors import principal_for_user

logger = logging.getLogger(__name__)

ACCOUNT = "account"
ADDRESS = "address"
# Where the request leaves the refusal for throttled_login to answer 429.
_REQUEST_ATTR = "proof_login_lockout"


@dataclass(frozen=True)
class Lockout:
    scope: str  # ACCOUNT or ADDRESS
    retry_after_s: int

    @property
    def message(self) -> str:
        minutes = max(1, -(-self.retry_after_s // 60))
        what = "this account" if self.scope == ACCOUNT else "your address"
        return (
            f"Too many failed sign-ins for {what}. Sign-in is locked; try again in "
            f"{minutes} minute{'s' if minutes != 1 else ''}."
        )


def client_address(request: HttpRequest | None) -> str:
    """The peer address. Not X-Forwarded-For: a client may write that header, and one that could
    choose its address would choose a fresh one per guess (a proxy in front passes the peer)."""
    if request is None:
        return "unknown"
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def _account_key(username: str) -> str:
    # Hashed: a username is user input of any length and any characters.
    digest = hashlib.sha256(username.strip().lower().encode("utf-8", "replace")).hexdigest()
    return f"{ACCOUNT}:{digest[:32]}"


def _address_key(address: str) -> str:
    return f"{ADDRESS}:{address[:64]}"


def _cache_key(kind: str, key: str) -> str:
    return f"{settings.PROOF_LOGIN_CACHE_PREFIX}:{kind}:{key}"


def _limit(scope: str) -> int:
    if scope == ACCOUNT:
        return int(settings.PROOF_LOGIN_MAX_FAILURES)
    return int(settings.PROOF_LOGIN_MAX_ADDRESS_FAILURES)


def _locked(key: str) -> int:
    """Seconds the key stays locked (0: not locked)."""
    until = cache.get(_cache_key("lock", key))
    if until is None:
        return 0
    return max(1, int(float(until) - time.time() + 0.999))


def _count_failure(key: str) -> int:
    counter = _cache_key("fail", key)
    cache.add(counter, 0, timeout=int(settings.PROOF_LOGIN_WINDOW_S))
    try:
        return int(cache.incr(counter))
    except ValueError:  # the window ran out between add and incr: this failure opens the next
        cache.set(counter, 1, timeout=int(settings.PROOF_LOGIN_WINDOW_S))
        return 1


def _lock(key: str) -> int:
    seconds = int(settings.PROOF_LOGIN_LOCKOUT_S)
    cache.set(_cache_key("lock", key), time.time() + seconds, timeout=seconds)
    cache.delete(_cache_key("fail", key))
    return seconds


def lockout_for(username: str, address: str) -> Lockout | None:
    """The lockout in force for this account or this address, if any (the longer one)."""
    found = [
        Lockout(scope, seconds)
        for scope, key in ((ACCOUNT, _account_key(username)), (ADDRESS, _address_key(address)))
        if (seconds := _locked(key))
    ]
    return max(found, key=lambda lockout: lockout.retry_after_s) if found else None


def _audit(user: AbstractBaseUser | None, action: str, detail: dict[str, Any]) -> None:
    """An audit entry in the user's operator's log; none for users without a membership (staff,
    unknown usernames): the audit log is per operator."""
    principal = principal_for_user(user) if user is not None else None
    if user is None or principal is None:
        return
    with tenant_context(principal.operator_id):
        record_audit(principal, action, "user", user.pk, actor=user.get_username(), detail=detail)


def _user_named(username: str) -> AbstractBaseUser | None:
    model = get_user_model()
    found: AbstractBaseUser | None = model._default_manager.filter(
        **{model.USERNAME_FIELD: username}
    ).first()
    return found


def do_record_failure(username: str, address: str, where: str) -> Lockout | None:
    """Count one failed sign-in for the account and the address; lock either that reaches its
    limit. Returns the lockout this failure started, if any."""
    user = _user_named(username)
    detail = {"address": address, "where": where, "username": username[:150]}
    _audit(user, "login.failure", detail)
    started: Lockout | None = None
    for scope, key in ((ACCOUNT, _account_key(username)), (ADDRESS, _address_key(address))):
        if _count_failure(key) >= _limit(scope):
            started = Lockout(scope, _lock(key))
            logger.warning("sign-in locked: %s %s (%s)", scope, username[:150], address)
            _audit(
                user, "login.lockout", {**detail, "scope": scope, "seconds": started.retry_after_s}
            )
    return started


def do_unlock(username: str = "", address: str = "") -> None:
    """Clear the count and the lockout of an account and/or an address (staff, from a shell,
    when a locked-out person has been verified another way; tests)."""
    keys = [_account_key(username)] if username else []
    keys += [_address_key(address)] if address else []
    cache.delete_many([_cache_key(kind, key) for key in keys for kind in ("fail", "lock")])


def do_record_success(user: AbstractBaseUser, address: str, where: str) -> None:
    """A sign-in that got in: the account's failure count starts again."""
    cache.delete(_cache_key("fail", _account_key(user.get_username())))
    _audit(user, "login.success", {"address": address, "where": where})


class _ThrottledFormMixin:
    """Refuses a locked account or address before authenticating; counts failures and successes.
    For AuthenticationForm and its subclasses (they define request, cleaned_data, get_user)."""

    where = "console"
    request: HttpRequest | None
    cleaned_data: dict[str, Any]

    def clean(self) -> dict[str, Any]:
        username = str(self.cleaned_data.get("username") or "")
        address = client_address(self.request)
        lockout = lockout_for(username, address)
        if lockout is not None:
            logger.info("sign-in refused while locked: %s %s", lockout.scope, address)
            self._refuse(lockout)
        try:
            cleaned: dict[str, Any] = super().clean()  # type: ignore[misc]
        except forms.ValidationError:
            started = do_record_failure(username, address, self.where)
            if started is not None:
                self._refuse(started)
            raise
        user = self.get_user()  # type: ignore[attr-defined]
        if user is not None:  # None: a field was missing, so nothing was tried
            do_record_success(user, address, self.where)
        return cleaned

    def _refuse(self, lockout: Lockout) -> None:
        if self.request is not None:
            setattr(self.request, _REQUEST_ATTR, lockout)
        raise forms.ValidationError(lockout.message, code="locked_out")


class ThrottledAuthenticationForm(_ThrottledFormMixin, AuthenticationForm):
    where = "console"


class ThrottledAdminAuthenticationForm(_ThrottledFormMixin, AdminAuthenticationForm):
    """The admin's form refuses a right password of a non-staff user: that counts as a failure."""

    where = "admin"


def throttled_login(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Wraps a login view whose form is one of the above: a refused attempt answers 429 with
    Retry-After (the page itself, with the form's message)."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = view(request, *args, **kwargs)
        lockout: Lockout | None = getattr(request, _REQUEST_ATTR, None)
        if lockout is not None:
            response.status_code = 429
            response["Retry-After"] = str(lockout.retry_after_s)
        return response

    return wrapped
