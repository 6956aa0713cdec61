"""Cursor pagination, the default of every API list.

A list answers `{"next": <url or null>, "previous": <url or null>, "results": [...]}`; the
client follows `next` (an opaque `?cursor=`) and may set `?page_size=` (1 to 500, default
100). Cursors stay right while rows are added — unlike offsets, a new row never shifts a page
nor repeats one — and a page costs the same at the millionth row as at the first (no count,
no OFFSET scan).

The order: the view's `cursor_ordering` if it sets one, else the order its queryset already
has (the selector's or the model's Meta ordering), always ending in the primary key so it is
total. DRF positions the cursor on the first field (ties broken by an offset within it), so
that field must be a plain column of the model, never null; otherwise the list is ordered
newest first by primary key.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.exceptions import FieldDoesNotExist
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import ForeignKey, IntegerField, QuerySet
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request

from tenants.api.limits import integer_range, text_problem

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
_FALLBACK_ORDERING = ("-pk",)


def _usable_first_field(model: Any, name: str) -> bool:
    field_name = name.lstrip("-")
    if field_name == "pk":
        return True
    if "__" in field_name:
        return False
    try:
        field = model._meta.get_field(field_name)
    except FieldDoesNotExist:
        return False
    return bool(getattr(field, "concrete", False)) and not getattr(field, "null", True)


def _with_pk_tiebreak(ordering: tuple[str, ...]) -> tuple[str, ...]:
    if any(name.lstrip("-") in ("pk", "id") for name in ordering):
        return ordering
    return (*ordering, "-pk" if ordering[0].startswith("-") else "pk")


def ordering_for(queryset: QuerySet[Any], view: Any) -> tuple[str, ...]:
    """The total order a cursor pages `queryset` in (see the module docstring)."""
    explicit: tuple[str, ...] | None = getattr(view, "cursor_ordering", None)
    if explicit:
        return _with_pk_tiebreak(tuple(explicit))
    given = tuple(queryset.query.order_by) or tuple(queryset.model._meta.ordering or ())
    # Expressions (F("x").desc()) cannot carry a cursor position.
    current = tuple(name for name in given if isinstance(name, str))
    if not current or len(current) != len(given):
        return _FALLBACK_ORDERING
    if not _usable_first_field(queryset.model, current[0]):
        return _FALLBACK_ORDERING
    return _with_pk_tiebreak(current)


class ProofCursorPagination(CursorPagination):
    page_size = DEFAULT_PAGE_SIZE
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE
    ordering: ClassVar[Any] = _FALLBACK_ORDERING  # type: ignore[misc]
    _model: Any = None

    def get_ordering(self, request: Request, queryset: QuerySet[Any], view: Any) -> tuple[str, ...]:
        # decode_cursor (called next) checks the cursor's position against this model's field.
        self._model = queryset.model
        return ordering_for(queryset, view)

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None or raw == "":
            return self.page_size
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if not 1 <= size <= self.max_page_size:
            raise ValidationError(
                {
                    self.page_size_query_param: [
                        f"must be a whole number from 1 to {self.max_page_size}, not {raw!r}"
                    ]
                }
            )
        return size

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["description"] = f"rows per page, 1 to {self.max_page_size}"
                parameter["schema"].update(
                    minimum=1, maximum=self.max_page_size, default=self.page_size
                )
            elif parameter["name"] == self.cursor_query_param:
                parameter["description"] = "the cursor of a page: follow `next` or `previous`"
        return parameters

    def decode_cursor(self, request: Request) -> Cursor | None:
        try:
            cursor = super().decode_cursor(request)
        except NotFound:
            cursor, position_ok = None, False
        else:
            position_ok = cursor is None or self._position_fits(
                None if cursor.position is None else str(cursor.position)
            )
        if not position_ok:
            # A cursor is only ever one we gave out: a mangled one is bad input, not a
            # missing page (nor, filtered on as it stands, a 500).
            raise ValidationError(
                {self.cursor_query_param: ["not a cursor this API gave out; follow `next`"]}
            )
        return cursor

    def _position_fits(self, position: str | None) -> bool:
        """Whether a decoded cursor's position is a value of the ordering's first field."""
        if position is None:
            return True
        if text_problem(position) is not None:
            return False
        name = self.ordering[0].lstrip("-")
        meta = self._model._meta
        field = meta.pk if name == "pk" else meta.get_field(name)
        try:
            value = field.to_python(position)
        except DjangoValidationError:
            return False
        if isinstance(value, int) and isinstance(field, IntegerField | ForeignKey):
            low, high = integer_range(field)
            return low <= value <= high
        return True
