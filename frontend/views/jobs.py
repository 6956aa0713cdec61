"""The jobs list (`/jobs/`) and the job page (`/jobs/<job_id>/`). Operators see every job of
theirs, customer users their customer's (another customer's or operator's job is a 404).
docs/console.md "Jobs" and "Job page" say what each number is and what each page reads."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from frontend.access import console_view
from frontend.selectors.job_detail import job_page
from frontend.selectors.jobs import (
    DEFAULT_SORT,
    KINDS,
    SORT_KEYS,
    BadParameter,
    job_list_page,
    list_params,
)
from ingest.models import JobState
from tenants.access import Principal

# Columns whose first click sorts descending (biggest first); the others sort ascending.
_NUMERIC_FIRST = {"started", "gpus", "nodes", "duration", "share", "incidents"}


def _bad_parameter(request: HttpRequest, error: BadParameter) -> HttpResponse:
    return render(
        request,
        "proof/console/_job_bad_parameter.html",
        {"error": error, "section": "jobs"},
        status=400,
    )


@console_view(operator_only=False)
def job_list(request: HttpRequest, principal: Principal) -> HttpResponse:
    try:
        params = list_params(request.GET, principal)
    except BadParameter as error:
        return _bad_parameter(request, error)
    page = job_list_page(principal, params)
    current = params.sort.removeprefix("-")
    descending = params.sort.startswith("-")
    sort_links = {}
    for key in SORT_KEYS:
        if key == current:
            target = key if descending else f"-{key}"
        else:
            target = f"-{key}" if key in _NUMERIC_FIRST else key
        arrow = ("▼" if descending else "▲") if key == current else ""
        sort_links[key] = {
            "query": params.query(sort=None if target == DEFAULT_SORT else target, page=None),
            "arrow": arrow,
        }
    return render(
        request,
        "proof/console/jobs.html",
        {
            "section": "jobs",
            "wide": True,
            "page": page,
            "params": params,
            "sort": sort_links,
            "states": JobState.values,
            "kinds": KINDS,
            "previous_query": params.query(page=page.number - 1),
            "next_query": params.query(page=page.number + 1),
        },
    )


@console_view(operator_only=False)
def job_detail(request: HttpRequest, principal: Principal, job_id: str) -> HttpResponse:
    ranks = request.GET.get("ranks", "")
    if ranks not in ("", "all"):
        return _bad_parameter(request, BadParameter("ranks", f"'all' or nothing, not {ranks!r}"))
    page = job_page(principal, job_id, all_ranks=ranks == "all")
    return render(
        request,
        "proof/console/job.html",
        {"section": "jobs", "wide": True, "page": page, "job": page.job},
    )
