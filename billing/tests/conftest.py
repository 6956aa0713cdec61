"""Billing's fixtures: the local fake of Stripe's HTTP endpoints, with the real `stripe`
library pointed at it through the settings billing reads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import stripe

from billing.tests.fake_stripe import FakeStripe, serve

WEBHOOK_SECRET = "whsec_test_secret_for_the_fake"


@pytest.fixture
def fake_stripe(settings: Any) -> Iterator[FakeStripe]:
    fake, base, server = serve()
    settings.BILLING_STRIPE_SECRET_KEY = "sk_test_fake"
    settings.BILLING_STRIPE_API_BASE = base
    settings.BILLING_STRIPE_METER_ID = "mtr_fake"
    settings.BILLING_STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    saved = (stripe.api_key, stripe.api_base, stripe.max_network_retries)
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        stripe.api_key, stripe.api_base, stripe.max_network_retries = saved
