"""How the API describes itself in OpenAPI 3.1 (drf-spectacular, REST_FRAMEWORK
["DEFAULT_SCHEMA_CLASS"]).

Every operation documents, besides its own success response, the error answers any endpoint
can give — each with the one error shape (tenants/api/errors.py) — and, for GET, the `ETag`
it sends, the `If-None-Match` it honours and the `304` it answers then (tenants/api/base.py).
The Bearer token is the `bearerAuth` security scheme.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter

from tenants.api.errors import ErrorSerializer

# Answers any operation may give, whatever it does.
_ERRORS = {
    "400": "Bad input: `fields` names each field (or query parameter) and its problem.",
    "401": "No credentials, or an unknown, expired or revoked token.",
    "403": "Authenticated, but this role or token scope may not do this.",
    "404": "No such object among those this principal may see (another tenant's reads the same).",
    "429": "Too many requests for this token: wait `Retry-After` seconds.",
}
_RETRY_AFTER = {
    "Retry-After": {
        "schema": {"type": "integer", "minimum": 0},
        "description": "seconds until the token's rate allows another request",
    }
}
_ETAG = {
    "ETag": {
        "schema": {"type": "string"},
        "description": 'a weak validator of this body (W/"..."): send it back as If-None-Match',
    }
}


class ApiTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "tenants.api.authentication.ApiTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        definition: dict[str, Any] = build_bearer_security_scheme_object(
            header_name="Authorization",
            token_prefix="Bearer",  # noqa: S106 - the auth scheme word, not a secret
        )
        definition["description"] = (
            "An API token (`prf_...`) made in Settings > API tokens or POST /api/v1/api-tokens/; "
            "its scope is read, read_write (write) or admin."
        )
        return definition


class ProofAutoSchema(AutoSchema):
    def get_override_parameters(self) -> list[Any]:
        parameters = list(super().get_override_parameters())
        if self.method == "GET":
            parameters.append(
                OpenApiParameter(
                    "If-None-Match",
                    OpenApiTypes.STR,
                    OpenApiParameter.HEADER,
                    description="an ETag this endpoint sent: 304 with no body if still current",
                )
            )
        return parameters

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        error = self.resolve_serializer(ErrorSerializer, "response")
        for code, description in _ERRORS.items():
            if code in responses:
                continue
            responses[code] = {
                "description": description,
                "content": {"application/json": {"schema": error.ref}},
            }
            if code == "429":
                responses[code]["headers"] = dict(_RETRY_AFTER)
        if self.method == "GET":
            for code, response in responses.items():
                if code.startswith("2"):
                    response.setdefault("headers", {}).update(_ETAG)
            responses.setdefault(
                "304",
                {
                    "description": "Not modified: If-None-Match matched the current ETag.",
                    "headers": dict(_ETAG),
                },
            )
        return responses
