"""Settings come from the environment and fail loudly; production refuses unsafe values."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from proof_web import env

REPO = Path(__file__).resolve().parent.parent
GOOD_KEY = secrets.token_urlsafe(48)


def _settings_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PROOF_") and k not in ("DJANGO_SETTINGS_MODULE",)
    }
    base.update(PROOF_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="proof_web.settings")
    base.update(overrides)
    return base


def _import_settings(tmp_path: Path, **overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import proof_web.settings"],
        cwd=REPO,
        env=_settings_env(tmp_path, **overrides),
        capture_output=True,
        text=True,
        timeout=60,
    )


PRODUCTION = {"PROOF_ENV": "production", "PROOF_ALLOWED_HOSTS": "proof.example.com"}


def test_production_settings_load_with_safe_values(tmp_path: Path) -> None:
    result = _import_settings(tmp_path, **PRODUCTION, PROOF_SECRET_KEY=GOOD_KEY)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"PROOF_DEBUG": "1", "PROOF_SECRET_KEY": GOOD_KEY},
            "refuses to start with PROOF_DEBUG on",
        ),
        ({}, "needs PROOF_SECRET_KEY set to a random value of 50+ characters"),
        ({"PROOF_SECRET_KEY": "short-key"}, "needs PROOF_SECRET_KEY set to a random value"),
        (
            {"PROOF_SECRET_KEY": "proof-insecure-development-key-do-not-use-in-production"},
            "needs PROOF_SECRET_KEY",
        ),
        (
            {"PROOF_SECRET_KEY": GOOD_KEY, "PROOF_ALLOWED_HOSTS": ""},
            "needs PROOF_ALLOWED_HOSTS",
        ),
        (
            {"PROOF_SECRET_KEY": GOOD_KEY, "PROOF_DEBUG": "maybe"},
            "PROOF_DEBUG='maybe' is not a boolean",
        ),
    ],
)
def test_production_settings_refuse_unsafe_values(
    tmp_path: Path, overrides: dict[str, str], message: str
) -> None:
    result = _import_settings(tmp_path, **{**PRODUCTION, **overrides})
    assert result.returncode != 0
    assert "EnvError" in result.stderr and message in result.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"PROOF_ENV": "staging"},
            "PROOF_ENV='staging' must be one of development, production, test",
        ),
        (
            {
                "DATABASE_URL": "postgres://app:x@127.0.0.1/proof",
                "DATABASE_OWNER_URL": "postgres://app:x@127.0.0.1/proof",
            },
            "DATABASE_URL and DATABASE_OWNER_URL use the same role",
        ),
        (
            {
                "DATABASE_URL": "postgres://same@127.0.0.1/proof",
                "DATABASE_OWNER_URL": "postgres://same@127.0.0.1/proof",
            },
            "use the same role ('same')",
        ),
        ({"DATABASE_URL": "mysql://u@h/db"}, "only postgres:// URLs are supported"),
    ],
)
def test_bad_environment_fails_at_start(
    tmp_path: Path, overrides: dict[str, str], message: str
) -> None:
    result = _import_settings(tmp_path, **overrides)
    assert result.returncode != 0
    assert message in result.stderr


def test_check_deploy_is_clean_with_production_settings(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=REPO,
        env=_settings_env(tmp_path, **PRODUCTION, PROOF_SECRET_KEY=GOOD_KEY, PROOF_DEBUG="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_env_helpers_fail_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_BOOL", "yes")
    assert env.env_bool("X_BOOL", False) is True
    monkeypatch.setenv("X_BOOL", "sometimes")
    with pytest.raises(env.EnvError, match="X_BOOL='sometimes' is not a boolean"):
        env.env_bool("X_BOOL", False)
    monkeypatch.setenv("X_INT", "12")
    assert env.env_int("X_INT", 0, minimum=1) == 12
    monkeypatch.setenv("X_INT", "twelve")
    with pytest.raises(env.EnvError, match="X_INT='twelve' is not an integer"):
        env.env_int("X_INT", 0)
    monkeypatch.setenv("X_INT", "0")
    with pytest.raises(env.EnvError, match="X_INT=0 is below the minimum of 1"):
        env.env_int("X_INT", 5, minimum=1)
    monkeypatch.setenv("X_FLOAT", "nan")
    with pytest.raises(env.EnvError, match="not a finite number"):
        env.env_float("X_FLOAT", 1.0)
    monkeypatch.setenv("X_FLOAT", "1.5")
    assert env.env_float("X_FLOAT", 1.0) == 1.5
    monkeypatch.delenv("X_REQUIRED", raising=False)
    with pytest.raises(env.EnvError, match="X_REQUIRED is required but not set"):
        env.env_str("X_REQUIRED")
    monkeypatch.setenv("X_LIST", " a, b,,c ")
    assert env.env_list("X_LIST", []) == ["a", "b", "c"]
    monkeypatch.setenv("X_CHOICE", "blue")
    with pytest.raises(env.EnvError, match="X_CHOICE='blue' must be one of red, green"):
        env.env_choice("X_CHOICE", "red", ("red", "green"))


def test_database_urls_parse_or_fail_clearly() -> None:
    url = env.parse_database_url(
        "D", "postgres://app:p%40ss@db.internal:6543/proof?sslmode=require"
    )
    assert (url.user, url.password, url.host, url.port, url.name) == (
        "app",
        "p@ss",
        "db.internal",
        6543,
        "proof",
    )
    assert url.options == {"sslmode": "require"}
    with pytest.raises(env.EnvError, match="names no database"):
        env.parse_database_url("D", "postgres://app@host/")
    with pytest.raises(env.EnvError, match="names no user"):
        env.parse_database_url("D", "postgres://host/db")
    with pytest.raises(env.EnvError, match=r"port .* is not a number"):
        env.parse_database_url("D", "postgres://app@host:port/db")


def test_env_example_lists_every_variable_the_code_reads() -> None:
    import re

    pattern = re.compile(
        r"env_(?:str|bool|int|float|list|choice|optional|database_url)\(\s*\"([A-Z][A-Z0-9_]*)\""
    )
    read: set[str] = set()
    for path in (REPO / "proof_web").rglob("*.py"):
        read |= set(pattern.findall(path.read_text()))
    assert {"PROOF_SECRET_KEY", "DATABASE_URL", "PROOF_ADMIN_DATABASE_URL"} <= read
    example = (REPO / ".env.example").read_text()
    listed = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", example, flags=re.MULTILINE))
    missing = sorted(read - listed)
    assert missing == [], f".env.example lacks (add each with a comment): {missing}"
    # Each listed variable carries a comment on the line(s) just above it.
    lines = example.splitlines()
    for index, line in enumerate(lines):
        if re.match(r"^[A-Z][A-Z0-9_]*=", line):
            assert lines[index - 1].startswith(("#", "PROOF_INGEST_TLS_CERT=")), line
