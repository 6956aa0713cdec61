"""`billing_banners` in every console page's context: the cache's banners (billing/banner.py)
for operator users; none for customers, none without a principal. No query."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from billing.banner import banners


def billing_banners(request: HttpRequest) -> dict[str, Any]:
    principal = getattr(request, "principal", None)
    if principal is None or not principal.is_operator:
        return {}
    return {"billing_banners": banners(principal.operator_id)}
