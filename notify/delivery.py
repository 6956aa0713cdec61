"""The outbox worker: claim due rows, send each with a short timeout, record what came back.

A claim is one short transaction over every operator's rows (system_context):
`SELECT … FOR UPDATE SKIP LOCKED` picks due rows no other worker is claiming, and each claimed
row's attempt count goes up and its next attempt moves a lease ahead — so a second worker, or
this one's next run, skips it until the lease runs out (a worker killed mid-send leaves the row
to be retried then). The sends run outside any transaction, all of a claim's rows at once in
threads, each with its own timeout: a receiver that hangs costs its own row the timeout and
never delays another channel's row. Nothing here runs in an evaluation: verdicts never wait
on a receiver.

Outcome of an attempt (Standard Webhooks' retry guidance): 2xx sent; 410 Gone disables the
channel; another 4xx gives up (logged on the row); 429, 5xx, a timeout or a connection error
retries after RETRY_SCHEDULE_S[attempt - 1] (or the receiver's Retry-After when longer, up to
the schedule's longest wait), and gives up once the schedule is spent.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.utils import timezone

from notify import formats
from notify.models import ChannelKind, DeliveryState, NotificationChannel, OutboxDelivery
from notify.services import active_secrets
from tenants.context import system_context

log = logging.getLogger(__name__)

# Standard Webhooks' schedule after the first attempt: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h,
# 10 h (eight attempts over about 27.6 hours). Read at run time so tests may shrink it.
RETRY_SCHEDULE_S: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 36000)
# Rows claimed (and sent at once, one thread each) per pass.
CLAIM_BATCH = 32
MAX_SEND_THREADS = 16


def timeout_s() -> float:
    return float(settings.PROOF_NOTIFY_TIMEOUT_S)


def lease_s() -> float:
    # Longer than any send can take (connect + read timeouts, plus the thread's start), so a
    # live worker's row is never claimed again while its send is still running.
    return 2 * timeout_s() + 30


@dataclass(frozen=True)
class Claimed:
    row_id: int
    attempt: int
    channel_id: int
    kind: str
    message: formats.HttpMessage | None  # None for email
    email: EmailMessage | None


@dataclass(frozen=True)
class Outcome:
    status: int | None  # the HTTP status, None when none came back
    error: str  # "" on success
    retry: bool  # worth another attempt (timeout, connection error, 429, 5xx)
    retry_after_s: float | None = None  # a 429's or 503's Retry-After, in seconds

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300 and not self.error


def _message(channel: NotificationChannel, row: OutboxDelivery, now: datetime) -> Claimed:
    payload: dict[str, Any] = row.payload
    kind = channel.kind
    message = email = None
    if kind == ChannelKind.SLACK:
        message = formats.slack(channel.target, payload)
    elif kind == ChannelKind.TEAMS:
        message = formats.teams(channel.target, payload)
    elif kind == ChannelKind.PAGERDUTY:
        message = formats.pagerduty(settings.PROOF_PAGERDUTY_EVENTS_URL, channel.target, payload)
    elif kind == ChannelKind.WEBHOOK:
        message = formats.webhook(
            channel.target,
            payload,
            msg_id=row.event_id,
            timestamp=int(now.timestamp()),
            secrets=active_secrets(channel, now),
        )
    else:
        email = EmailMessage(
            subject=formats.email_subject(payload),
            body=formats.email_text(payload),
            from_email=settings.DEFAULT_FROM_EMAIL,
            to=list(channel.addresses or []),
            headers={"Message-ID": f"<{row.event_id}@proof>"},
        )
    return Claimed(int(row.pk), row.attempts, channel.pk, kind, message, email)


def claim(now: datetime | None = None, limit: int = CLAIM_BATCH) -> list[Claimed]:
    """Take up to `limit` due rows for this worker (no other claim sees them for a lease)."""
    now = now or timezone.now()
    claimed: list[Claimed] = []
    with transaction.atomic(), system_context():
        rows = list(
            OutboxDelivery.objects.filter(
                state__in=[DeliveryState.PENDING, DeliveryState.FAILED],
                next_attempt_at__lte=now,
            )
            .order_by("next_attempt_at", "id")
            .select_for_update(skip_locked=True)[:limit]
        )
        if not rows:
            return []
        channels = {
            c.pk: c
            for c in NotificationChannel.objects.filter(
                pk__in={r.channel_id for r in rows}
            ).prefetch_related("secrets")
        }
        lease_until = now + timedelta(seconds=lease_s())
        for row in rows:
            channel = channels[row.channel_id]
            if not channel.enabled:
                row.state = DeliveryState.GAVE_UP
                row.last_error = "channel disabled"
                row.save(update_fields=["state", "last_error"])
                continue
            row.attempts += 1
            row.next_attempt_at = lease_until
            row.save(update_fields=["attempts", "next_attempt_at"])
            claimed.append(_message(channel, row, now))
    return claimed


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is an answer, not a place to go: following it could lead the worker anywhere
    (an address inside the network); it ends the delivery like another 4xx."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def destination_refused(url: str) -> str:
    """Why the worker will not post to `url` ("" if it will). Unless PROOF_NOTIFY_ALLOW_PRIVATE
    (the default outside production), a destination that resolves to a loopback, private,
    link-local or otherwise internal address is refused, so a channel cannot make the server
    call its own network (cloud metadata, Redis, the database)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"not an http(s) URL: {parts.scheme or '?'}://"
    if settings.PROOF_NOTIFY_ALLOW_PRIVATE:
        return ""
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"cannot resolve {parts.hostname}: {exc}"
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global or address.is_multicast:
            return f"{parts.hostname} resolves to an internal address ({address})"
    return ""


def send_http(message: formats.HttpMessage, timeout: float) -> Outcome:
    refused = destination_refused(message.url)
    if refused:
        return Outcome(None, f"destination refused: {refused}"[:500], False)
    request = urllib.request.Request(  # noqa: S310 - checked just above: http(s) only
        message.url, data=message.body, headers=message.headers, method="POST"
    )
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            response.read(65536)
            return Outcome(int(response.status), "", False)
    except urllib.error.HTTPError as exc:
        status = int(exc.code)
        retry = status == 429 or status >= 500
        return Outcome(
            status, f"HTTP {status} {exc.reason}"[:500], retry, _retry_after(exc.headers)
        )
    except TimeoutError as exc:
        return Outcome(None, f"timed out after {timeout:g} s: {exc}"[:500], True)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            return Outcome(None, f"timed out after {timeout:g} s: {exc.reason}"[:500], True)
        return Outcome(None, f"connection failed: {exc.reason}"[:500], True)
    except OSError as exc:  # a reset or refused connection mid-exchange
        return Outcome(None, f"connection failed: {exc}"[:500], True)


def _retry_after(headers: Any) -> float | None:
    """A Retry-After in seconds (the HTTP-date form is rare from webhook receivers: ignored)."""
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def send_email(email: EmailMessage, timeout: float) -> Outcome:
    try:
        email.connection = get_connection(timeout=timeout)
        email.send(fail_silently=False)
    except (TimeoutError, ConnectionError, OSError) as exc:
        return Outcome(None, f"SMTP: {exc}"[:500], True)
    except Exception as exc:  # smtplib's refusals (SMTPRecipientsRefused, …): permanent
        return Outcome(None, f"SMTP refused: {exc}"[:500], False)
    return Outcome(250, "", False)


def send(item: Claimed, timeout: float) -> Outcome:
    if item.message is not None:
        return send_http(item.message, timeout)
    if item.email is None:
        raise ValueError(f"outbox row {item.row_id} has neither a request nor an e-mail")
    return send_email(item.email, timeout)


def record(item: Claimed, outcome: Outcome, now: datetime | None = None) -> str:
    """Write an attempt's outcome on its row; the row's new state. Only the claim that made
    this attempt may write it (the attempt number matches), so a worker that outlived its
    lease never overwrites a later attempt's result."""
    now = now or timezone.now()
    update: dict[str, Any] = {"last_status": outcome.status, "last_error": outcome.error}
    if outcome.ok:
        update.update(state=DeliveryState.SENT, sent_at=now, last_error="")
    elif outcome.status == 410:
        update.update(state=DeliveryState.GAVE_UP, last_error="410 Gone: channel disabled")
    elif outcome.retry and item.attempt <= len(RETRY_SCHEDULE_S):
        delay = RETRY_SCHEDULE_S[item.attempt - 1]
        if outcome.retry_after_s is not None:
            # The receiver asked for longer: honoured, up to the schedule's longest wait.
            delay = max(delay, min(outcome.retry_after_s, max(RETRY_SCHEDULE_S)))
        update.update(state=DeliveryState.FAILED, next_attempt_at=now + timedelta(seconds=delay))
    else:
        update.update(state=DeliveryState.GAVE_UP)
    with transaction.atomic(), system_context():
        OutboxDelivery.objects.filter(pk=item.row_id, attempts=item.attempt).update(**update)
        if outcome.status == 410:
            NotificationChannel.objects.filter(pk=item.channel_id).update(
                enabled=False,
                disabled_reason=f"the receiver answered 410 Gone ({now:%Y-%m-%d %H:%M} UTC)",
            )
    if not outcome.ok:
        log.warning(
            "notification delivery %s (channel %s, attempt %s): %s",
            item.row_id,
            item.channel_id,
            item.attempt,
            outcome.error or outcome.status,
        )
    return str(update["state"])


def deliver_due(limit: int = CLAIM_BATCH) -> int:
    """One pass: claim due rows, send them all at once, record each; the rows attempted."""
    items = claim(limit=limit)
    if not items:
        return 0
    timeout = timeout_s()
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(MAX_SEND_THREADS, len(items))) as pool:
        futures = {pool.submit(send, item, timeout): item for item in items}
        # Recorded as each finishes: a hanging receiver never holds back another's result.
        for future in as_completed(futures):
            record(futures[future], future.result())
    log.debug("delivered %d outbox rows in %.2f s", len(items), time.monotonic() - started)
    return len(items)
