"""Typed readers for settings that come from the environment.

Each helper fails loudly (ImproperlyConfigured naming the variable and the bad
value) instead of silently falling back, so a typo in production is caught at
start-up rather than after a night of lost telemetry.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import parse_qs, unquote, urlparse

N = TypeVar("N", int, float)


class EnvError(Exception):
    """A variable is set to something we cannot use."""


def env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name)
    if value is None or value == "":
        if default is None:
            raise EnvError(f"environment variable {name} is required but not set")
        return default
    return value


def env_optional(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value else None


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise EnvError(f"{name}={raw!r} is not a boolean (use one of {sorted(_TRUE | _FALSE)})")


def _env_number(
    name: str, default: N, minimum: N | None, parse: Callable[[str], N], kind: str
) -> N:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = parse(raw)
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not {kind}") from None
    if minimum is not None and value < minimum:
        raise EnvError(f"{name}={value} is below the minimum of {minimum}")
    return value


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    return _env_number(name, default, minimum, int, "an integer")


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    def finite(raw: str) -> float:
        value = float(raw)
        if value != value or value in (float("inf"), float("-inf")):
            raise EnvError(f"{name}={raw!r} is not a finite number")
        return value

    return _env_number(name, default, minimum, finite, "a number")


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env_str(name, default)
    if value not in choices:
        raise EnvError(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value


@dataclass(frozen=True)
class DatabaseUrl:
    user: str
    password: str
    host: str
    port: int
    name: str
    options: dict[str, str]

    def django(self) -> dict[str, object]:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": self.name,
            "USER": self.user,
            "PASSWORD": self.password,
            "HOST": self.host,
            "PORT": str(self.port),
            "OPTIONS": dict(self.options),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }


def parse_database_url(name: str, raw: str) -> DatabaseUrl:
    """Parse postgres://user:pass@host:port/dbname?sslmode=... into its parts."""
    parsed = urlparse(raw)
    if parsed.scheme not in ("postgres", "postgresql"):
        raise EnvError(f"{name}: only postgres:// URLs are supported, got scheme {parsed.scheme!r}")
    db = parsed.path.lstrip("/")
    if not db:
        raise EnvError(f"{name}: the URL names no database (expected postgres://user@host/DB)")
    if not parsed.username:
        raise EnvError(f"{name}: the URL names no user (expected postgres://USER@host/db)")
    try:
        port = parsed.port or 5432
    except ValueError:
        raise EnvError(f"{name}: the port in {raw!r} is not a number") from None
    options = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    return DatabaseUrl(
        user=unquote(parsed.username),
        password=unquote(parsed.password or ""),
        host=parsed.hostname or "127.0.0.1",
        port=port,
        name=db,
        options=options,
    )


def env_database_url(name: str) -> DatabaseUrl | None:
    raw = env_optional(name)
    return parse_database_url(name, raw) if raw else None
