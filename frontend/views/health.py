"""/health/ — operators only: the days-ahead forecast (components at risk within 1/3/7 days,
their evidence charted over days, the drain plan) and the GPUs degrading or failing now,
ranked by drain urgency, with trend charts of the counters their verdicts cite."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from engine import forecast as fc
from frontend.access import console_view
from frontend.selectors import health as selectors
from frontend.views._fleet_params import BadParameter, bad_parameter_response, int_param
from investigations import forecast_selectors, forecast_services
from investigations.models import ComponentForecast
from tenants.access import Principal
from tenants.context import tenant_context

# The forecast table shows the components most at risk first, this many at most (the API
# pages through all of them).
FORECAST_ROWS = 50
_LABELS = {r.signal: (r.label, r.unit, r.limit) for rules in fc.RULES.values() for r in rules}


def _charts(row: ComponentForecast, n: int) -> list[dict[str, Any]]:
    """One chart spec per evidence signal (charts.js): its daily values over the look-back,
    the threshold it heads for dashed."""
    result = row.result or {}
    daily = result.get("daily") or {}
    end = float(result.get("end_ts") or row.evaluated_at.timestamp())
    out = []
    for k, e in enumerate(result.get("evidence") or []):
        values = daily.get(e["signal"]) or []
        label, unit, limit = _LABELS.get(e["signal"], (e["signal"], "", None))
        x = [end - (len(values) - i) * 86400.0 for i in range(len(values))]
        out.append(
            {
                "chart_id": f"forecast-{n}-{k}",
                "label": f"{label} per day · dashed: {e['heading_for']}",
                "spec": {
                    "x": x,
                    "series": [{"label": label, "values": values, "unit": unit}],
                    "interval": [end - float(e.get("days_rising") or 0) * 86400.0, end],
                    "baseline": limit,
                },
            }
        )
    return out


def forecast_context(principal: Principal) -> dict[str, Any]:
    operator_id = principal.operator_id
    with tenant_context(operator_id):
        rows = forecast_selectors.flagged(operator_id)[:FORECAST_ROWS]
    components = [
        {
            "row": r,
            "n": n,
            "evidence": (r.result or {}).get("evidence") or [],
            "charts": _charts(r, n),
        }
        for n, r in enumerate(rows, start=1)
    ]
    return {
        "components": components,
        "drain_plan": forecast_services.drain_plan(operator_id),
        "levels": {lvl: sum(1 for r in rows if r.level == lvl) for lvl in fc.LEVELS[1:]},
    }


@console_view(operator_only=True)
def health(request: HttpRequest, principal: Principal) -> HttpResponse:
    try:
        days = int_param(request.GET, "days", selectors.DEFAULT_DAYS, 1, selectors.MAX_DAYS)
        page = int_param(request.GET, "page", 1, 1, 1_000_000)
    except BadParameter as error:
        return bad_parameter_response(request, error, "health")
    data = selectors.health_page(principal, days=days, page=page)
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "proof/console/health.html",
        {
            "page_title": "Fleet health",
            "section": "health",
            "wide": True,
            "data": data,
            "query": query.urlencode(),
            "tiers": selectors.TIERS,
            "forecast": forecast_context(principal),
        },
    )
