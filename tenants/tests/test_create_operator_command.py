from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import authenticate
from django.core.management import CommandError, call_command

from tenants.context import system_context
from tenants.models import Membership, Operator, Role

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("create_operator", *args, stdout=out)
    return out.getvalue()


def test_creates_operator_and_admin_with_given_password() -> None:
    output = run(
        "--name",
        "Acme GPU Cloud",
        "--slug",
        "acme",
        "--admin-username",
        "acme-admin",
        "--admin-email",
        "ops@acme.example",
        "--admin-password",
        "a-long-admin-passphrase",
    )
    assert "Created operator 'Acme GPU Cloud' (slug acme" in output
    assert "Generated" not in output
    user = authenticate(username="acme-admin", password="a-long-admin-passphrase")
    assert user is not None and user.email == "ops@acme.example"
    with system_context():
        membership = Membership.objects.get(user=user)
        assert membership.role == Role.OPERATOR_ADMIN
        assert membership.operator.slug == "acme"


def test_generates_and_prints_a_password_when_none_given() -> None:
    output = run("--name", "Beta", "--slug", "beta", "--admin-username", "beta-admin")
    line = next(x for x in output.splitlines() if x.startswith("Generated admin password"))
    password = line.rsplit(" ", 1)[-1]
    assert len(password) >= 20
    assert authenticate(username="beta-admin", password=password) is not None


def test_bad_input_fails_clearly_and_creates_nothing() -> None:
    run("--name", "Acme", "--slug", "acme", "--admin-username", "first")
    with pytest.raises(CommandError, match="slug 'acme' already exists"):
        run("--name", "Again", "--slug", "acme", "--admin-username", "second")
    with pytest.raises(CommandError, match="user named 'first' already exists"):
        run("--name", "Other", "--slug", "other", "--admin-username", "first")
    with pytest.raises(CommandError, match="slug 'bad slug' is not valid"):
        run("--name", "Other", "--slug", "bad slug", "--admin-username", "third")
    with pytest.raises(CommandError, match="admin password refused"):
        run(
            "--name", "Other", "--slug", "other", "--admin-username", "x", "--admin-password", "123"
        )
    with system_context():
        assert list(Operator.objects.values_list("slug", flat=True)) == ["acme"]
