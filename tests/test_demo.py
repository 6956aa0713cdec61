"""`proof demo`'s setup: migrate + demo data, safe to run again."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import authenticate

from proof_web.commands.demo import DEMO_LOGINS, ensure_demo_data
from tenants.context import system_context
from tenants.models import Customer, Membership, Operator
from tenants.selectors import principal_for_user
from tests.helpers import embedded_default_env

REPO = Path(__file__).resolve().parent.parent


def test_setup_only_twice_on_the_embedded_default(tmp_path: Path) -> None:
    env = embedded_default_env(tmp_path)
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "-m", "proof_web.cli", "demo", "--setup-only"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        assert "demo data ready" in result.stdout
        for login in DEMO_LOGINS:
            assert f"{login.username:<15} password {login.password}" in result.stdout
    with sqlite3.connect(tmp_path / "proof.sqlite3") as db:
        counts = [
            db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("tenants_operator", "tenants_customer", "tenants_membership", "auth_user")
        ]
    assert counts == [1, 1, 2, 2]


@pytest.mark.django_db
def test_ensure_demo_data_is_idempotent_and_repairs_logins(settings: object) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # type: ignore[attr-defined]
    first = ensure_demo_data()
    admin, viewer = DEMO_LOGINS
    user = authenticate(username=admin.username, password=admin.password)
    assert user is not None
    user.set_password("changed-by-someone")
    user.save()
    assert ensure_demo_data() == first
    with system_context():
        assert Operator.objects.count() == 1
        assert Customer.objects.count() == 1
        assert Membership.objects.count() == 2
    for login in DEMO_LOGINS:
        user = authenticate(username=login.username, password=login.password)
        assert user is not None, login.username
        principal = principal_for_user(user)
        assert principal is not None and principal.role == login.role
    viewer_principal = principal_for_user(
        authenticate(username=viewer.username, password=viewer.password)  # type: ignore[arg-type]
    )
    assert viewer_principal is not None
    assert viewer_principal.customer_id == first["customer_id"]
