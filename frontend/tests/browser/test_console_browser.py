"""The console in a real browser: an operator signs in and opens the fleet, a job and a
verdict, whose charts render (uPlot canvases inside every `[data-chart]`, each marked
data-drawn="true" by charts.js); a customer signs in and sees only its own jobs, and another
customer's job is a 404 page. Every page is also checked for script errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest

from frontend.seeding import Login, SeedResult
from frontend.tests.browser.conftest import VIEWPORT, chromium
from ingest.models import Job
from investigations.models import Incident
from tenants.context import tenant_context

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Shoot = Callable[[Any, str], None]


def _job_url(job_id: str) -> str:
    return f"/jobs/{quote(job_id, safe='/')}/"


def _open(page: Any, base: str, path: str, status: int = 200) -> Any:
    response = page.goto(base + path)
    assert response is not None and response.status == status, (path, response and response.status)
    return response


def _sign_in(page: Any, base: str, login: Login) -> None:
    _open(page, base, "/login/")
    page.fill('input[name="username"]', login.username)
    page.fill('input[name="password"]', login.password)
    page.click('button[type="submit"]')
    page.wait_for_url(base + "/")


def _charts_drawn(page: Any) -> int:
    """Every chart of the page drawn: a canvas inside each [data-chart], data-drawn="true"."""
    charts = page.locator("[data-chart]")
    count = int(charts.count())
    assert count > 0, "the page has no chart"
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-chart]')].every("
        "el => el.dataset.drawn === 'true' && el.querySelector('canvas'))",
        timeout=15_000,
    )
    return count


def _watch_errors(page: Any) -> list[str]:
    """Script errors, and sub-resources (scripts, styles, data) that failed to load. The
    documents' own statuses are checked where they are opened (some 404s are the point)."""
    errors: list[str] = []

    def on_console(msg: Any) -> None:
        # A failed load is reported again as a console error; the response hook judges it.
        if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
            errors.append(f"console: {msg.text}")

    def on_response(response: Any) -> None:
        request = response.request
        if (
            response.status >= 400
            and request.resource_type != "document"
            and not request.url.endswith("/favicon.ico")
        ):
            errors.append(f"{response.status} {request.resource_type} {request.url}")

    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("console", on_console)
    page.on("response", on_response)
    return errors


def test_operator_sees_fleet_job_and_verdict_with_charts(
    live_server: Any, seeded: SeedResult, shoot: Shoot
) -> None:
    main = seeded.main
    charted = main.charted[0]
    with tenant_context(main.operator_id):
        verdict = (
            Incident.objects.for_tenant(main.operator_id)
            .filter(job_id=charted.job_pk)
            .order_by("-last_seen")
            .first()
        )
        assert verdict is not None, "the detectors found nothing on the charted job"
        public_id = str(verdict.public_id)
    base = live_server.url
    with chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        errors = _watch_errors(page)
        _sign_in(page, base, main.logins["operator_admin"])

        _open(page, base, "/fleet/")
        html = page.content()
        # Its own nodes (50 a page: the simulated ones or the seeded racks), none of the other's.
        assert charted.nodes[0] in html or f"{main.slug[:12]}-gpu" in html
        assert f"{seeded.other.slug[:12]}-gpu" not in html
        shoot(page, "fleet")

        _open(page, base, _job_url(charted.job_id))
        assert charted.job_id in page.content()
        assert _charts_drawn(page) >= 3
        shoot(page, "job")

        _open(page, base, f"/incidents/{public_id}/")
        assert verdict.title[:40] in page.content()
        _charts_drawn(page)
        shoot(page, "incident")

        for path, name in (
            ("/jobs/", "jobs"),
            ("/incidents/", "incidents"),
            ("/health/", "health"),
            ("/price/", "price"),
            ("/settings/", "settings"),
        ):
            _open(page, base, path)
            shoot(page, name)
        # Another operator's job is a 404 here too.
        _open(page, base, _job_url(seeded.other.job_ids[-1]), status=404)
        assert not errors, errors


def test_customer_sees_only_its_own_jobs(
    live_server: Any, seeded: SeedResult, shoot: Shoot
) -> None:
    main = seeded.main
    login = seeded.customer_login()
    mine = [j for j, c in main.job_customer.items() if c == login.customer_id]
    theirs = [j for j, c in main.job_customer.items() if c != login.customer_id]
    assert mine and theirs
    with tenant_context(main.operator_id):
        # Ids that cannot be a substring of another job's (nor of a number on the page).
        distinct = set(Job.objects.for_tenant(main.operator_id).values_list("job_id", flat=True))
    foreign = seeded.job_not_of_customer(login.customer_id or 0)
    base = live_server.url
    with chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        errors = _watch_errors(page)
        _sign_in(page, base, login)
        _open(page, base, "/jobs/")
        html = page.content()
        shown = [j for j in mine if j in html]
        assert shown, "none of the customer's own jobs is listed"
        leaked = [j for j in theirs if j in html and not any(j != k and j in k for k in distinct)]
        assert not leaked, leaked
        shoot(page, "customer-jobs")
        _open(page, base, _job_url(seeded.job_of_customer(login.customer_id)))
        _open(page, base, _job_url(foreign), status=404)
        assert foreign not in page.inner_text("body")
        _open(page, base, "/fleet/", status=404)
        assert not errors, errors
