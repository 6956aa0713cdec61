"""Per-token request rates: REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"].

Each API token is counted on its own, at its own `rate_limit` when it has one, else at
PROOF_API_RATE; a session at PROOF_API_RATE per user; an anonymous request (only the schema
and docs answer those) at PROOF_API_ANON_RATE per address. Counts live in the Django cache,
Redis in production, so every web process shares them. Over the rate: 429 with Retry-After
(seconds) and the error shape.
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from tenants.api.permissions import principal_or_none


class PrincipalRateThrottle(SimpleRateThrottle):
    scope = "principal"

    def allow_request(self, request: Request, view: Any) -> bool:
        principal = principal_or_none(request)
        if principal is not None and principal.rate_limit:
            self.rate = principal.rate_limit
        elif principal is None and not request.user.is_authenticated:
            self.rate = self.THROTTLE_RATES["anonymous"]
        else:
            self.rate = self.THROTTLE_RATES[self.scope]
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        principal = principal_or_none(request)
        if principal is not None and principal.api_token_id is not None:
            # The token's display prefix is random: two databases' token 1 (tests sharing one
            # Redis) are not counted together.
            ident = f"token:{principal.api_token_id}:{request.user}"
        elif request.user.is_authenticated:
            ident = f"user:{request.user.pk}:{request.user.get_username()}"
        else:
            ident = f"anon:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
