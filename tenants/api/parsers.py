"""The API's body parsers (REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]): DRF's, with the limits of
tenants/api/limits.py applied while parsing, so every endpoint gets them.

DRF's JSONParser reads the whole stream whatever its size and lets a RecursionError (a body
nested thousands deep) escape as a 500; this one reads at most MAX_BODY_BYTES + 1 bytes and
answers 413 past that, and 400 for nesting, non-objects, NaN and unstorable text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from django.http import QueryDict
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser

from tenants.api.limits import MAX_BODY_BYTES, check_body, check_form


class RequestBodyTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"
    default_detail = f"The request body is larger than {MAX_BODY_BYTES} bytes."


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_limited(stream: IO[bytes]) -> bytes:
    data = stream.read(MAX_BODY_BYTES + 1)
    if len(data) > MAX_BODY_BYTES:
        raise RequestBodyTooLarge()
    return data


class LimitedJSONParser(JSONParser):
    def parse(
        self,
        stream: IO[bytes],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        raw = read_limited(stream)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ParseError(f"The request body is not UTF-8: {error.reason}.") from None
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except RecursionError:
            raise ParseError("The request body is nested too deep.") from None
        except ValueError as error:
            raise ParseError(f"The request body is not valid JSON: {error}.") from None
        check_body(data)
        return data


class LimitedFormParser(FormParser):
    def parse(
        self,
        stream: IO[bytes],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        data = QueryDict(read_limited(stream), encoding=encoding)
        check_form(data)
        return data


class LimitedMultiPartParser(MultiPartParser):
    def parse(
        self,
        stream: IO[bytes],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        parsed = super().parse(stream, media_type, parser_context)
        check_form(parsed.data)
        return parsed
