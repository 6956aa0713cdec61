"""Air-gapped sites: the Ed25519-signed licence (operator, GPU cap, expiry), checked at start
and daily; the signed usage report the site sends back (docs/billing.md, "Licence").

A licence file is JSON: {"licence": {"operator": "acme", "gpu_cap": 512, "expires":
"2027-12-31"}, "signature": "<base64 Ed25519 signature of the licence's canonical JSON>"}.
Canonical JSON: keys sorted, no spaces, UTF-8. Past the cap or the expiry the console and the
log say so clearly; verdicts continue for PROOF_LICENCE_GRACE_DAYS, then are held (the same
hold as dunning). Ingest never stops in any licence state.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings

from billing import banner, selectors
from billing.models import LicenceStatus
from billing.pricing import gpu_months, next_month
from ingest import selectors as ingest_selectors
from investigations import verdict_hold
from tenants.selectors import operator_by_slug

log = logging.getLogger(__name__)

LICENCE_HOLD_PREFIX = "licence: "


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(document: dict[str, Any], key: Ed25519PrivateKey, field: str) -> dict[str, Any]:
    """{field: document, "signature": base64 signature of its canonical JSON}."""
    return {
        field: document,
        "signature": base64.b64encode(key.sign(canonical(document))).decode(),
    }


def public_key_b64(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


class LicenceError(ValueError):
    pass


@dataclass(frozen=True)
class Licence:
    operator: str
    gpu_cap: int
    expires: date


def load_licence(path: str, public_key_b64_text: str) -> Licence:
    """Read and verify the licence file; a LicenceError naming what is wrong otherwise."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LicenceError(f"licence file {path} cannot be read: {exc}") from None
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64_text))
    except ValueError as exc:
        raise LicenceError(f"PROOF_LICENCE_PUBLIC_KEY is not an Ed25519 key: {exc}") from None
    if not isinstance(raw, dict) or "licence" not in raw or "signature" not in raw:
        raise LicenceError(f"licence file {path}: expected {{'licence': …, 'signature': …}}")
    try:
        key.verify(base64.b64decode(raw["signature"]), canonical(raw["licence"]))
    except (InvalidSignature, ValueError):
        raise LicenceError(f"licence file {path}: the signature does not verify") from None
    body = raw["licence"]
    try:
        return Licence(
            str(body["operator"]), int(body["gpu_cap"]), date.fromisoformat(body["expires"])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise LicenceError(f"licence file {path}: bad field {exc}") from None


def _gpus_today(operator_id: int, now: datetime) -> int:
    start = datetime.combine(now.date(), time(0), UTC)
    t0 = int((start - timedelta(days=1)).timestamp() * 1000)  # yesterday too: a full day's view
    return len(
        ingest_selectors.gpus_reported_between(operator_id, t0, int(now.timestamp() * 1000) + 1)
    )


def check(now: datetime | None = None) -> LicenceStatus | None:
    """Check the licence now; None where no licence is configured (a Stripe or demo site)."""
    if not settings.LICENCE_FILE:
        return None
    now = now or datetime.now(UTC)
    previous = LicenceStatus.objects.order_by("-checked_at", "-id").first()
    lapsed_since = previous.lapsed_since if previous else None
    operator_id: int | None = None
    try:
        if not settings.LICENCE_PUBLIC_KEY:
            raise LicenceError("PROOF_LICENCE_PUBLIC_KEY is not set")
        lic = load_licence(settings.LICENCE_FILE, settings.LICENCE_PUBLIC_KEY)
        operator = operator_by_slug(lic.operator)
        if operator is None:
            raise LicenceError(f"the licence is for operator {lic.operator!r}, which is not here")
        operator_id = int(operator.pk)
        gpus = _gpus_today(operator_id, now)
        problems = []
        if lic.expires < now.date():
            problems.append(f"the licence expired on {lic.expires:%Y-%m-%d}")
        if gpus > lic.gpu_cap:
            problems.append(f"{gpus} GPUs reported, above the licence's cap of {lic.gpu_cap}")
        status = LicenceStatus(
            checked_at=now,
            valid=not problems,
            operator_slug=lic.operator,
            gpu_cap=lic.gpu_cap,
            expires_on=lic.expires,
            gpus_now=gpus,
        )
        message = "; ".join(problems) or (
            f"licensed for {lic.gpu_cap} GPUs until {lic.expires:%Y-%m-%d} ({gpus} in use)"
        )
    except LicenceError as exc:
        status = LicenceStatus(checked_at=now, valid=False)
        message = str(exc)
    if status.valid:
        lapsed_since = None
    else:
        lapsed_since = lapsed_since or now
        grace_end = lapsed_since + timedelta(days=settings.LICENCE_GRACE_DAYS)
        if now < grace_end:
            message += (
                f". Verdicts continue until {grace_end:%Y-%m-%d %H:%M} UTC; ingest never stops."
            )
        else:
            message += ". Verdicts are paused until a valid licence is installed; ingest goes on."
    status.lapsed_since = lapsed_since
    status.message = message[:500]
    status.save()
    if operator_id is not None:
        _apply_hold(operator_id, status, now)
    banner.publish_licence(None if status.valid else status.message)
    if not status.valid:
        log.warning("licence: %s", status.message)
    return status


def _apply_hold(operator_id: int, status: LicenceStatus, now: datetime) -> None:
    hold = verdict_hold.current_hold(operator_id)
    grace = timedelta(days=settings.LICENCE_GRACE_DAYS)
    if status.lapsed_since is not None and now >= status.lapsed_since + grace:
        if hold is None:
            verdict_hold.do_hold_verdicts(operator_id, LICENCE_HOLD_PREFIX + status.message, now)
    elif hold is not None and hold.reason.startswith(LICENCE_HOLD_PREFIX):
        verdict_hold.do_release_verdicts(operator_id)


def latest_status() -> LicenceStatus | None:
    if not settings.LICENCE_FILE:
        return None
    return LicenceStatus.objects.order_by("-checked_at", "-id").first()


# --- the signed usage report -----------------------------------------------------------------


def load_private_key(path: str) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise LicenceError(f"the export key {path} cannot be read: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise LicenceError(f"the export key {path} is not an Ed25519 private key")
    return key


def usage_report(operator_id: int, slug: str, month: date, now: datetime) -> dict[str, Any]:
    counts = selectors.day_counts(operator_id, month)
    days = [month + timedelta(days=k) for k in range((next_month(month) - month).days)]
    total = sum(counts.values())
    return {
        "format": "proof-usage-report/1",
        "operator": slug,
        "month": f"{month:%Y-%m}",
        "generated_at": now.isoformat(),
        "gpu_days_by_day": {f"{d:%Y-%m-%d}": counts.get(d, 0) for d in days},
        "gpu_days": total,
        "gpu_months": str(gpu_months(total, month).quantize(Decimal("0.0001"))),
        "gpus": [
            {"gpu": g.gpu, "model": g.gpu_model, "days": g.days, "nodes": g.nodes}
            for g in selectors.gpu_lines(operator_id, month)
        ],
    }


def signed_report(
    operator_id: int, slug: str, month: date, key: Ed25519PrivateKey, now: datetime | None = None
) -> dict[str, Any]:
    document = sign(usage_report(operator_id, slug, month, now or datetime.now(UTC)), key, "report")
    document["public_key"] = public_key_b64(key)
    return document


def verify_report(document: dict[str, Any], public_key_b64_text: str) -> bool:
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64_text))
    try:
        key.verify(base64.b64decode(document["signature"]), canonical(document["report"]))
    except InvalidSignature:
        return False
    return True
