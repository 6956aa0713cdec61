"""One JSON error shape for every API error response.

    {"error": {"status": 400, "code": "invalid", "message": "<one sentence>",
               "fields": {"<field>": ["<problem>", ...]}}}

`exception_handler` (REST_FRAMEWORK["EXCEPTION_HANDLER"]) lets DRF's own handler decide the
status and headers (WWW-Authenticate on 401, Retry-After on 429) and rewrites the body into
this shape. `error_body` is also what the scoped base applies to a view's own 4xx/5xx
`Response` (tenants/api/base.py), so an endpoint cannot answer errors in another shape.

A 404 always reads the same ("Not found."), whatever raised it: a foreign operator's id and an
id that does not exist must not be told apart by their message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponsePermanentRedirect,
    JsonResponse,
)
from django.urls import Resolver404, resolve
from rest_framework import exceptions, serializers
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

NOT_FOUND_MESSAGE = "Not found."

# The code for a status when the exception names none of its own.
_CODE_FOR_STATUS = {
    400: "invalid",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    410: "gone",
    413: "too_large",
    415: "unsupported_media_type",
    429: "throttled",
}
# Keys DRF and views use for a message that belongs to no field.
_GENERAL_KEYS = ("detail", "non_field_errors")


def is_error_body(data: Any) -> bool:
    return (
        isinstance(data, Mapping)
        and set(data) == {"error"}
        and isinstance(data["error"], Mapping)
        and "status" in data["error"]
    )


def _flatten(detail: Any, path: str, into: dict[str, list[str]]) -> None:
    """Field problems by dotted path ("rules.0.families"), each a list of strings."""
    if isinstance(detail, Mapping):
        for key, value in detail.items():
            _flatten(value, f"{path}.{key}" if path else str(key), into)
    elif isinstance(detail, list | tuple):
        if all(not isinstance(item, Mapping | list | tuple) for item in detail):
            if detail:
                into.setdefault(path, []).extend(str(item) for item in detail)
            return
        for index, item in enumerate(detail):
            _flatten(item, f"{path}.{index}" if path else str(index), into)
    elif detail is not None:
        into.setdefault(path, []).append(str(detail))


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "?", "!")) else f"{text}."


def error_body(status_code: int, detail: Any, code: str | None = None) -> dict[str, Any]:
    """The one error shape for `detail` (a DRF error detail, a dict of field problems, a
    string) answered with `status_code`."""
    problems: dict[str, list[str]] = {}
    _flatten(detail, "", problems)
    general: list[str] = []
    for key in (*_GENERAL_KEYS, ""):
        general.extend(problems.pop(key, []))
    if status_code == 404:
        message, problems = NOT_FOUND_MESSAGE, {}
    elif general:
        message = " ".join(_sentence(text) for text in general)
    elif problems:
        field, field_problems = next(iter(problems.items()))
        message = f"Invalid {field}: {field_problems[0].rstrip('.')}"
        if len(problems) > 1:
            message += f" (and {len(problems) - 1} more field(s) with problems)"
        message = _sentence(message)
    else:
        message = "Request failed."
    body: dict[str, Any] = {
        "status": status_code,
        "code": code or _CODE_FOR_STATUS.get(status_code, "error"),
        "message": message,
    }
    if problems:
        body["fields"] = problems
    return {"error": body}


def _code_of(exc: Exception, status_code: int) -> str:
    if isinstance(exc, exceptions.ValidationError):
        return "invalid"
    if isinstance(exc, Http404):
        return "not_found"
    if isinstance(exc, DjangoPermissionDenied):
        return "permission_denied"
    if isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        if isinstance(codes, str):
            return codes
        return str(exc.default_code)
    return _CODE_FOR_STATUS.get(status_code, "error")


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = drf_exception_handler(exc, context)
    if response is None:
        # Not an API error (a bug): Django answers 500 and logs it.
        return None
    response.data = error_body(
        response.status_code, response.data, _code_of(exc, response.status_code)
    )
    return response


UNKNOWN_ENDPOINT = "api-unknown"


def unknown_endpoint(request: HttpRequest, rest: str = "") -> HttpResponse:
    """The last route under /api/v1/: a path no endpoint has is a 404 in the error shape, not
    Django's HTML page. Being a route, it would stop CommonMiddleware's APPEND_SLASH redirect,
    so it redirects a GET to the same path with the slash when an endpoint has that one."""
    if not request.path_info.endswith("/") and request.method in ("GET", "HEAD"):
        try:
            match = resolve(request.path_info + "/")
        except Resolver404:
            match = None
        if match is not None and match.url_name != UNKNOWN_ENDPOINT:
            return HttpResponsePermanentRedirect(request.get_full_path(force_append_slash=True))
    return JsonResponse(error_body(404, None), status=404)


class ErrorDetailSerializer(serializers.Serializer[dict[str, Any]]):
    status = serializers.IntegerField(help_text="the HTTP status, repeated")
    code = serializers.CharField(
        help_text="machine-readable: invalid, not_authenticated, authentication_failed, "
        "permission_denied, not_found, method_not_allowed, conflict, throttled, ..."
    )
    message = serializers.CharField(help_text="one sentence for people")
    # The metaclass takes declared fields off the class, so this does not shadow
    # Serializer.fields at run time; mypy sees only the class body.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="for 400: each field (dotted path for nested ones) and its problems",
    )


class ErrorSerializer(serializers.Serializer[dict[str, Any]]):
    """The body of every 4xx answer of the API."""

    error = ErrorDetailSerializer()
