"""Secrets for API and agent tokens: generated here, stored only as their SHA-256.

A token is `<kind>_<43 url-safe characters>` (256 bits from `secrets`), so a plain SHA-256 is
enough to store it: there is nothing to brute-force, unlike a password. The first characters
(`prefix`) are kept in clear so people can tell their tokens apart.
"""

from __future__ import annotations

import hashlib
import secrets

API_TOKEN_KIND = "prf"  # noqa: S105 - a token's public kind prefix, not a secret
AGENT_TOKEN_KIND = "prfa"  # noqa: S105 - a token's public kind prefix, not a secret
PREFIX_SECRET_CHARS = 8


def new_secret(kind: str) -> tuple[str, str, str]:
    """(plaintext, prefix, hash) of a fresh token of `kind`."""
    plaintext = f"{kind}_{secrets.token_urlsafe(32)}"
    return plaintext, display_prefix(plaintext), hash_secret(plaintext)


def display_prefix(plaintext: str) -> str:
    kind, _, rest = plaintext.partition("_")
    return f"{kind}_{rest[:PREFIX_SECRET_CHARS]}"


def hash_secret(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()
