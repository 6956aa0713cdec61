"""The air-gapped licence: Ed25519-signed (operator, GPU cap, expiry); a forged, tampered or
unreadable file is refused with a message naming why; past the cap or the expiry the message
says so and verdicts continue for the grace period, then are held (ingest never stops); a
valid licence again releases the hold. Checked at start (worker_ready) and daily."""

from __future__ import annotations

import base64
import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from billing import licence
from billing.banner import banners
from billing.tests.helpers import rollups
from investigations import verdict_hold
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def _write(path: Path, key: Ed25519PrivateKey, **body: Any) -> None:
    path.write_text(json.dumps(licence.sign(body, key, "licence")))


@pytest.fixture
def proof_key(settings: Any, tmp_path: Path) -> tuple[Ed25519PrivateKey, Path]:
    key = Ed25519PrivateKey.generate()
    settings.LICENCE_PUBLIC_KEY = licence.public_key_b64(key)
    settings.LICENCE_FILE = str(tmp_path / "licence.json")
    settings.LICENCE_GRACE_DAYS = 14
    return key, tmp_path / "licence.json"


def test_valid_cap_expiry_grace_hold_and_release(
    proof_key: tuple[Ed25519PrivateKey, Path],
) -> None:
    key, path = proof_key
    a = make_tenant("lic-a")
    op = a.operator.pk
    now = datetime.now(UTC)
    rollups(op, {"n": ["G1", "G2", "G3"]}, [now.date()])
    _write(path, key, operator="lic-a", gpu_cap=4, expires=f"{now.date() + timedelta(days=30)}")
    status = licence.check(now)
    assert status is not None and status.valid and status.gpus_now == 3
    assert "licensed for 4 GPUs" in status.message
    # Past the cap: a clear message, verdicts continue through the grace period.
    _write(path, key, operator="lic-a", gpu_cap=2, expires=f"{now.date() + timedelta(days=30)}")
    over = licence.check(now)
    assert over is not None and not over.valid
    assert "3 GPUs reported, above the licence's cap of 2" in over.message
    assert "Verdicts continue until" in over.message and "ingest never stops" in over.message
    assert verdict_hold.current_hold(op) is None
    assert any("cap of 2" in b["text"] for b in banners(op))
    # Past the grace period (the GPUs still reporting): held.
    rollups(op, {"n": ["G1", "G2", "G3"]}, [(now + timedelta(days=15)).date()])
    later = licence.check(now + timedelta(days=15))
    assert later is not None and "Verdicts are paused" in later.message
    hold = verdict_hold.current_hold(op)
    assert hold is not None and hold.reason.startswith(licence.LICENCE_HOLD_PREFIX)
    # A new licence: valid again, the hold released (its period evaluated), the banner gone.
    _write(path, key, operator="lic-a", gpu_cap=8, expires=f"{now.date() + timedelta(days=365)}")
    again = licence.check(now + timedelta(days=15, hours=1))
    assert again is not None and again.valid and again.lapsed_since is None
    assert verdict_hold.current_hold(op) is None
    assert banners(op) == []


def test_expired_forged_and_tampered_licences(
    proof_key: tuple[Ed25519PrivateKey, Path], settings: Any
) -> None:
    key, path = proof_key
    make_tenant("lic-b")
    _write(path, key, operator="lic-b", gpu_cap=4, expires="2026-01-31")
    status = licence.check(datetime(2026, 2, 1, tzinfo=UTC))
    assert status is not None and "expired on 2026-01-31" in status.message
    # Signed by another key.
    _write(path, Ed25519PrivateKey.generate(), operator="lic-b", gpu_cap=4, expires="2030-01-01")
    forged = licence.check()
    assert forged is not None and not forged.valid and "does not verify" in forged.message
    # Tampered after signing: the cap raised.
    _write(path, key, operator="lic-b", gpu_cap=4, expires="2030-01-01")
    doc = json.loads(path.read_text())
    doc["licence"]["gpu_cap"] = 4000
    path.write_text(json.dumps(doc))
    tampered = licence.check()
    assert tampered is not None and "does not verify" in tampered.message
    path.write_text("not json")
    assert "cannot be read" in (licence.check() or pytest.fail()).message
    _write(path, key, operator="nobody", gpu_cap=4, expires="2030-01-01")
    assert "not here" in (licence.check() or pytest.fail()).message
    settings.LICENCE_PUBLIC_KEY = base64.b64encode(b"short").decode()
    assert "not an Ed25519 key" in (licence.check() or pytest.fail()).message
    settings.LICENCE_FILE = None
    assert licence.check() is None  # no licence configured: nothing checked


def test_expiry_is_a_date_inclusive(proof_key: tuple[Ed25519PrivateKey, Path]) -> None:
    key, path = proof_key
    make_tenant("lic-c")
    _write(path, key, operator="lic-c", gpu_cap=1, expires="2028-02-29")
    on_the_day = licence.check(datetime(2028, 2, 29, 23, 0, tzinfo=UTC))
    assert on_the_day is not None and on_the_day.valid
    assert date(2028, 2, 29) == on_the_day.expires_on
