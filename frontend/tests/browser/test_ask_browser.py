""" "Ask about this incident" in a real browser: the operator opens a verdict page, asks a
question in its box, and sees the answer appear (ask.js posts it to the API with the session,
a real in-process Celery worker answers it through the investigator, the page polls) with its
citations; an off-topic question is refused in plain words. The model is a real
chat-completions server on loopback (investigator/tests/chat_server.py), configured as the
process's writer the way PROOF_EXPLAIN_ENDPOINT configures one; the default local model's own
run is investigations/tests/test_ask_api.py (slow)."""

from __future__ import annotations

from typing import Any

import pytest

from frontend.seeding import SeedResult
from frontend.tests.browser.conftest import VIEWPORT, chromium
from frontend.tests.browser.test_console_browser import _open, _sign_in, _watch_errors
from investigations import explain_services
from investigations.models import Incident
from investigator.model import OpenAICompatibleWriter
from investigator.tests.chat_server import chat_server, cited_ids
from tenants.context import tenant_context

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _respond(body: dict[str, Any]) -> dict[str, Any]:
    first = next(i for i in cited_ids(body) if i.startswith("e"))
    return {
        "answerable": True,
        "answer": f"The GPU shows it in every value [{first}].",
        "cited": [first],
    }


def test_operator_asks_about_an_incident_and_sees_the_cited_answer(
    live_server: Any, seeded: SeedResult, start_task_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = seeded.main
    with tenant_context(main.operator_id):
        incident = (
            Incident.objects.for_tenant(main.operator_id)
            .filter(job__isnull=False)
            .order_by("-last_seen")
            .first()
        )
        assert incident is not None
        first_id = str(incident.verdict["evidence"][0]["id"])
    start_task_worker()
    base = live_server.url
    with chat_server(_respond) as server, chromium() as browser:
        monkeypatch.setattr(explain_services, "_WRITER", OpenAICompatibleWriter(server.url))
        page = browser.new_page(viewport=VIEWPORT)
        errors = _watch_errors(page)
        _sign_in(page, base, main.logins["operator_admin"])
        _open(page, base, f"/incidents/{incident.public_id}/")
        page.fill("[data-testid=ask-question]", "Which GPU is affected, and since when?")
        page.click("[data-testid=ask-submit]")
        answered = page.locator("[data-testid=question][data-state=answered]")
        answered.wait_for(timeout=30_000)
        assert (
            answered.locator(".question").inner_text() == "Which GPU is affected, and since when?"
        )
        answer = answered.locator("[data-testid=answer]").inner_text()
        assert answer == f"The GPU shows it in every value [{first_id}]."
        assert answered.locator("[data-testid=cited]").inner_text() == f"cites {first_id}"
        assert "every claim checked against the evidence" in answered.inner_text()
        assert len(server.requests) == 1

        page.fill("[data-testid=ask-question]", "Will it rain tomorrow?")
        page.click("[data-testid=ask-submit]")
        refused = page.locator("[data-testid=question][data-state=refused]")
        refused.wait_for(timeout=30_000)
        assert (
            refused.locator("[data-testid=answer]")
            .inner_text()
            .startswith("The evidence does not say anything about 'rain'")
        )
        assert len(server.requests) == 1  # refused before any model ran

        # a reload shows both, from the API (newest first)
        _open(page, base, f"/incidents/{incident.public_id}/")
        page.locator("[data-testid=question]").nth(1).wait_for(timeout=10_000)
        states = [
            page.locator("[data-testid=question]").nth(i).get_attribute("data-state")
            for i in range(2)
        ]
        assert states == ["refused", "answered"]
        # too long: the API's 400 names the field on the page
        page.evaluate(
            "document.querySelector('[data-testid=ask-question]').removeAttribute('maxlength')"
        )
        page.fill("[data-testid=ask-question]", "x" * 501)
        page.click("[data-testid=ask-submit]")
        page.wait_for_function(
            "() => document.querySelector('[data-testid=ask-status]').textContent.length > 0"
        )
        assert page.inner_text("[data-testid=ask-status]").startswith("Question: ")
        assert [e for e in errors if "/questions/" not in e] == []
