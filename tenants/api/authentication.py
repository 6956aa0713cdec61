"""API token authentication: `Authorization: Bearer <token>`.

A valid token becomes the request's principal (tenants.access.Principal): its operator, its
customer if customer-scoped, its role, and write access only if both the token's scope and
its role allow writes. Unknown, expired and revoked tokens get 401 with the reason. Requests
without a Bearer header fall through to session authentication, whose principal the
middleware has already set (tenants/middleware.py).
"""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from tenants.access import Principal
from tenants.services import TokenRejected, authenticate_api_token
from tenants.tokens import display_prefix


class ApiTokenUser:
    """`request.user` for token-authenticated requests: authenticated, but no Django user —
    everything a token may do follows from its principal, not from whoever created it."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None
    id = None

    def __init__(self, principal: Principal, prefix: str) -> None:
        self.principal = principal
        self.username = f"api-token:{prefix}"

    def __str__(self) -> str:
        return self.username

    def get_username(self) -> str:
        return self.username


class ApiTokenAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise AuthenticationFailed(
                "Malformed Authorization header: expected 'Bearer <token>' with no spaces "
                "in the token."
            )
        try:
            plaintext = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid API token.") from None
        try:
            principal = authenticate_api_token(plaintext)
        except TokenRejected as rejected:
            raise AuthenticationFailed(rejected.reason) from None
        # The principal lives on the Django request so middleware-level code sees it too;
        # DRF's Request reads attributes through to it.
        request._request.principal = principal  # type: ignore[attr-defined]
        return ApiTokenUser(principal, display_prefix(plaintext)), principal

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) with WWW-Authenticate when credentials are missing.
        return f'{self.keyword} realm="api"'
