"""/settings/billing/ in a real browser on the seeded operator: the admin sees this month's
GPUs and projected invoice and the usage lines, with no script error, and the past-due banner
on another page; a customer user of the same operator gets the 404 page and no banner."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.core.cache import cache

from billing import metering, services
from billing.tests.helpers import days_of, rollups
from frontend.seeding import SeedResult
from frontend.tests.browser.conftest import VIEWPORT, chromium
from frontend.tests.browser.test_console_browser import _open, _sign_in, _watch_errors

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_billing_page_and_banner(live_server: Any, seeded: SeedResult) -> None:
    cache.clear()
    main = seeded.main
    op = main.operator_id
    plan = services.do_upsert_plan(
        "browser", name="Browser plan", price_per_gpu_month=Decimal("60")
    )
    services.do_assign_plan(op, plan)
    today = datetime.now(UTC).date()
    past = [d for d in days_of(today.replace(day=1)) if d < today]
    rollups(op, {"bill-node": ["GPU-BILL-1"]}, [*past, today])
    for d in past:
        metering.do_meter_day(op, d)
    services.do_mark_past_due(op, "invoice in_b payment failed")
    base = live_server.url
    with chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)
        errors = _watch_errors(page)
        _sign_in(page, base, main.logins["operator_admin"])
        _open(page, base, "/settings/billing/")
        assert page.locator('[data-testid="billing-summary"]').is_visible()
        assert "$" in page.locator('[data-testid="projected"]').inner_text()
        if past:
            assert (
                page.locator('[data-testid="billing-gpus"]').inner_text().count("GPU-BILL-1") == 1
            )
        _open(page, base, "/jobs/")
        assert "Payment overdue" in page.locator('[data-testid="billing-banner"]').inner_text()
        assert errors == []
        customer = browser.new_page(viewport=VIEWPORT)
        _sign_in(customer, base, seeded.customer_login())
        _open(customer, base, "/settings/billing/", status=404)
        _open(customer, base, "/jobs/")
        assert customer.locator('[data-testid="billing-banner"]').count() == 0
