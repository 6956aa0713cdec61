from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # PBKDF2 at production strength costs ~0.5 s a user; tests make dozens of users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
