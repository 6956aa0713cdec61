from __future__ import annotations

from typing import Any

from django.http import HttpRequest


def principal(request: HttpRequest) -> dict[str, Any]:
    return {"principal": getattr(request, "principal", None)}
