"""/health/'s days-ahead section on real PostgreSQL: a forecast pass over stored rollups
(investigations/tests/test_forecast_api.py's world), the component listed with its risks,
evidence and daily chart, and the drain plan; another operator's component absent; customers
of the operator (and another customer) refused."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client

from contract import signals
from investigations import forecast_services
from investigations.tests.test_forecast_api import NOW, _world
from tenants.testing import TEST_PASSWORD, Tenant, make_second_customer, tenant_fixtures

pytestmark = pytest.mark.django_db

a, b = tenant_fixtures("hfa", "hfb")


def _client(user: Any) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def test_health_shows_the_forecast_its_charts_and_the_drain_plan(a: Tenant, b: Tenant) -> None:
    w = _world(a)
    wb = _world(b)
    forecast_services.run_forecast_pass(a.operator.pk, now=NOW)
    forecast_services.run_forecast_pass(b.operator.pk, now=NOW)
    response = _client(a.operator_admin).get("/health/")
    assert response.status_code == 200
    body = response.content.decode()
    table = body[body.index('data-testid="forecast"') : body.index('data-testid="drain-plan"')]
    assert f'data-key="{w["bad"]}"' in table and wb["bad"] not in body
    assert "heading for XID 48" in table
    match = re.search(r'<script id="forecast-1-0" type="application/json">(.*?)</script>', body)
    assert match
    spec = json.loads(match.group(1))
    assert spec["baseline"] == 5000.0 and len(spec["series"][0]["values"]) == 14
    assert spec["series"][0]["values"][-1] > 1000
    plan = body[body.index('data-testid="drain-plan"') :]
    assert w["n1"] in plan and "train-42" in plan
    assert signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL not in table  # labels, not field names


def test_customers_are_refused_the_health_page(a: Tenant) -> None:
    _world(a)
    forecast_services.run_forecast_pass(a.operator.pk, now=NOW)
    _, second_admin = make_second_customer(a)
    for user in (a.customer_admin, a.customer_viewer, second_admin):
        assert _client(user).get("/health/").status_code == 404
