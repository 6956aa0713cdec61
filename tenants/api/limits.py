"""What the API accepts, checked once for every endpoint (docs/api.md "Limits").

Bad input is refused here with a 4xx in the one error shape (tenants/api/errors.py), naming
what was wrong, before any of it reaches a query: PostgreSQL cannot hold a NUL character nor a
lone UTF-16 surrogate in text, nor an integer beyond its column's type, and a body nested
thousands deep would exhaust the stack of whoever walks it (the parser, a renderer, a
JSONField). Each of those used to be a 500.

- Bodies (tenants/api/parsers.py): at most MAX_BODY_BYTES, a JSON object (never a list or a
  scalar: every write endpoint takes named fields), nested at most MAX_JSON_DEPTH, no NaN or
  infinite number, every string (keys too) free of NUL and lone surrogates.
- Query parameters (`check_query_params`, called by the scoped base before the view runs):
  names and values free of NUL and lone surrogates, values at most MAX_QUERY_VALUE_CHARS.
- Integers (`bound_serializer`, applied by the scoped base to every serializer it builds or
  validates with): a field with no range of its own gets its model field's (the viewset's
  model, by the field's source name; a foreign key its target's primary key), else a 64-bit
  one, the widest any column holds. Strings likewise get their model field's max_length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.core.validators import MaxLengthValidator, MaxValueValidator, MinValueValidator
from django.db import connection, models
from rest_framework import serializers
from rest_framework.exceptions import ParseError, ValidationError

MAX_BODY_BYTES = 1024 * 1024
# Deeper than any body an endpoint takes (a channel's rules are 4 levels), far below where a
# recursive walk of it would fail.
MAX_JSON_DEPTH = 32
MAX_QUERY_VALUE_CHARS = 2048
INT64_RANGE = (-(2**63), 2**63 - 1)

# NUL, and the surrogate code points, which UTF-8 cannot encode alone.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def text_problem(text: str) -> str | None:
    """Why `text` cannot be accepted, or None."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "contains a NUL character (\\u0000)"
    return f"contains a lone surrogate (\\u{ord(found.group()):04x}), which is not valid Unicode"


def _walk(data: Any, path: str, depth: int) -> Iterator[tuple[str, Any, int]]:
    """Each value of a parsed JSON document with its dotted path and depth, iteratively (a
    deep document must not recurse)."""
    stack = [(data, path, depth)]
    while stack:
        value, where, level = stack.pop()
        yield where, value, level
        if isinstance(value, Mapping):
            for key, item in value.items():
                key_path = f"{where}.{key}" if where else str(key)
                yield key_path, str(key), level + 1
                stack.append((item, key_path, level + 1))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                stack.append((item, f"{where}.{index}" if where else str(index), level + 1))


def check_body(data: Any) -> None:
    """A parsed JSON body as the API accepts it, else ParseError (depth, not an object) or
    ValidationError naming the field."""
    if not isinstance(data, Mapping):
        raise ParseError(
            f"The request body must be a JSON object of named fields, not {_json_kind(data)}."
        )
    problems: dict[str, list[str]] = {}
    for where, value, depth in _walk(data, "", 0):
        if depth > MAX_JSON_DEPTH:
            raise ParseError(f"The request body is nested deeper than {MAX_JSON_DEPTH} levels.")
        problem: str | None = None
        if isinstance(value, str):
            problem = text_problem(value)
        elif isinstance(value, float) and not math.isfinite(value):
            problem = "is not a finite number"
        if problem is not None:
            problems.setdefault(where or "body", []).append(problem)
    if problems:
        raise ValidationError(problems)


def check_form(data: Any) -> None:
    """A parsed form (a QueryDict): every name and value storable text."""
    problems: dict[str, list[str]] = {}
    for key, values in data.lists():
        for text in (key, *(v for v in values if isinstance(v, str))):
            problem = text_problem(text)
            if problem is not None:
                problems.setdefault(_printable(key), []).append(problem)
    if problems:
        raise ValidationError(problems)


def _json_kind(data: Any) -> str:
    if isinstance(data, list):
        return "a list"
    if data is None:
        return "null"
    if isinstance(data, bool):
        return "a boolean"
    if isinstance(data, int | float):
        return "a number"
    return "a string"


def _printable(name: str) -> str:
    """A name safe to echo in an error (it may be the bad text itself)."""
    return _UNSTORABLE.sub("\ufffd", name)[:100]


def check_query_params(params: Any) -> None:
    """Query parameter names and values as the API accepts them, else ValidationError naming
    the parameter."""
    problems: dict[str, list[str]] = {}
    for key, values in params.lists():
        name = _printable(key)
        problem = text_problem(key)
        if problem is not None:
            problems.setdefault(name, []).append(f"the parameter's name {problem}")
        for value in values:
            problem = text_problem(value)
            if problem is None and len(value) > MAX_QUERY_VALUE_CHARS:
                problem = f"is longer than {MAX_QUERY_VALUE_CHARS} characters"
            if problem is not None:
                problems.setdefault(name, []).append(problem)
    if problems:
        raise ValidationError(problems)


def integer_range(field: models.Field[Any, Any]) -> tuple[int, int]:
    """The integers `field`'s column holds (a foreign key: its target's), from the database
    backend's own table of ranges."""
    target = field.target_field if isinstance(field, models.ForeignKey) else field
    found = connection.ops.integer_field_range(target.get_internal_type())
    low, high = found
    return (
        INT64_RANGE[0] if low is None else max(low, INT64_RANGE[0]),
        INT64_RANGE[1] if high is None else min(high, INT64_RANGE[1]),
    )


def _model_field(model: type[models.Model] | None, name: str) -> models.Field[Any, Any] | None:
    if model is None or not name or "." in name:
        return None
    try:
        field = model._meta.get_field(name.removesuffix("_id"))
    except FieldDoesNotExist:
        return None
    return field if isinstance(field, models.Field) else None


def _bound_integer(field: serializers.IntegerField, model_field: Any) -> None:
    low, high = INT64_RANGE
    if isinstance(model_field, models.IntegerField | models.ForeignKey):
        low, high = integer_range(model_field)
    if field.max_value is None or field.max_value > high:
        field.max_value = high
        message = field.error_messages["max_value"].format(max_value=high)
        field.validators.append(MaxValueValidator(high, message=message))
    if field.min_value is None or field.min_value < low:
        field.min_value = low
        message = field.error_messages["min_value"].format(min_value=low)
        field.validators.append(MinValueValidator(low, message=message))


def _bound_text(field: serializers.CharField, model_field: Any) -> None:
    limit = getattr(model_field, "max_length", None)
    if isinstance(model_field, models.CharField) and limit and field.max_length is None:
        field.max_length = limit
        message = field.error_messages["max_length"].format(max_length=limit)
        field.validators.append(MaxLengthValidator(limit, message=message))


def _bound_field(field: serializers.Field[Any, Any, Any, Any] | None, model: Any) -> None:
    if field is None or field.read_only:
        return
    if isinstance(field, serializers.ListSerializer):
        _bound_field(field.child, None)
    elif isinstance(field, serializers.Serializer):
        bound_serializer(field, None)
    elif isinstance(field, serializers.ListField | serializers.DictField):
        _bound_field(field.child, None)
    else:
        model_field = _model_field(model, field.source or field.field_name or "")
        if isinstance(field, serializers.IntegerField):
            _bound_integer(field, model_field)
        elif isinstance(field, serializers.CharField):
            _bound_text(field, model_field)


def bound_serializer(
    serializer: serializers.BaseSerializer[Any], model: type[models.Model] | None
) -> None:
    """Give every writable integer and string field of `serializer` (nested ones too) the
    range its column allows: `model`'s field of the same source name, else 64 bits."""
    if isinstance(serializer, serializers.ListSerializer):
        _bound_field(serializer.child, model)
        return
    if not isinstance(serializer, serializers.Serializer):
        return
    meta_model = getattr(getattr(serializer, "Meta", None), "model", None)
    for field in serializer.fields.values():
        _bound_field(field, meta_model or model)
