"""Shared by the settings page tests."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client

from tenants.testing import TEST_PASSWORD

# The queries every signed-in console page makes before its own: the session, the user, the
# membership (in a system context: savepoint, set, read, unset, release) and the tenant context
# around the view (savepoint, set, reset, release).
BASE_QUERIES = 11


def sign_in(client: Client, user: User) -> Client:
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client
