"""A forecast that crosses a risk level reaches the operator's channels through the outbox
(docs/fleet-health.md, "Notifications"): the rows are written in the forecast pass's own
transaction, the worker delivers them to real local receivers, once per crossing (not again
while the component stays at that level; again after a recovery cleared it and it crossed
anew), and never to another operator's channels or to a channel routed to a customer."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import numpy as np
import pytest
from django.db import transaction

from contract import signals
from ingest.models import Series, SeriesRollup
from investigations import forecast_services
from investigations.models import ComponentForecast
from investigations.tests.test_forecast_api import HOUR_MS, NOW, _world
from notify import delivery, services
from notify.models import DeliveryKind, DeliveryState, OutboxDelivery
from notify.tests.receivers import Receiver, running, verify
from tenants.context import system_context, tenant_context
from tenants.testing import Tenant, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)
DAY_S = 86400


@pytest.fixture(autouse=True)
def _fast(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.PROOF_NOTIFY_TIMEOUT_S = 1.0
    settings.PROOF_PUBLIC_URL = "https://proof.example"
    monkeypatch.setattr(delivery, "RETRY_SCHEDULE_S", (0.0, 0.0, 0.0))


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as s:
        yield s


def _rows(operator_id: int) -> list[OutboxDelivery]:
    with system_context():
        return list(
            OutboxDelivery.objects.filter(operator_id=operator_id)
            .select_related("channel")
            .order_by("id")
        )


def _degrade_again(t: Tenant, gpu: str, from_s: float) -> None:
    """Single-bit errors on `gpu` again: quiet for six days from `from_s`, then growing for
    six (a second degradation after the first one's recovery)."""
    op = t.operator.pk
    with tenant_context(op):
        series = Series.objects.for_tenant(op).get(
            gpu=gpu, name=signals.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL
        )
        last = SeriesRollup.objects.for_tenant(op).filter(series=series).order_by("-bucket_start_ms")[0]  # fmt: skip
        per_day = [2.0] * 6 + [40.0, 90.0, 200.0, 450.0, 1000.0, 2200.0]
        value = float(last.last)
        start_ms = int(from_s * 1000) - int(from_s * 1000) % HOUR_MS
        rows = []
        for i, inc in enumerate(np.repeat(np.asarray(per_day) / 24.0, 24)):
            rows.append(
                SeriesRollup(
                    operator_id=op,
                    series=series,
                    bucket_start_ms=start_ms + i * HOUR_MS,
                    count=60,
                    min=value,
                    max=value + inc,
                    sum=60 * value,
                    first=value,
                    last=value + inc,
                )
            )
            value += inc
        SeriesRollup.objects.bulk_create(rows, ignore_conflicts=True)


def test_a_crossing_reaches_the_operators_channels_once_per_crossing(stack: ExitStack) -> None:
    a, b = make_tenant("nfa"), make_tenant("nfb")
    world_a, world_b = _world(a), _world(b)
    admin = a.principal(a.operator_admin)
    hook = stack.enter_context(running(Receiver()))
    made = services.do_create_channel(admin, name="hook", kind="webhook", target=hook.url)
    assert made.secret is not None
    slack = stack.enter_context(running(Receiver()))
    services.do_create_channel(
        admin,
        name="fleet",
        kind="slack",
        target=slack.url,
        rules=[{"families": [services.FORECAST_FAMILY]}],
    )
    # Routed to one of a's customers: a forecast is about the operator's hardware, of no
    # customer, so this channel never hears of it; nor does a channel routed to verdicts of
    # one family only.
    customer = stack.enter_context(running(Receiver()))
    services.do_create_channel(
        admin, name="customer", kind="slack", target=customer.url,
        rules=[{"customer": a.customer.pk}],
    )  # fmt: skip
    jobs_only = stack.enter_context(running(Receiver()))
    services.do_create_channel(
        admin, name="jobs", kind="slack", target=jobs_only.url,
        rules=[{"families": ["sequence_imbalance"]}],
    )  # fmt: skip
    b_hook = stack.enter_context(running(Receiver()))
    b_made = services.do_create_channel(
        b.principal(b.operator_admin), name="b-hook", kind="webhook", target=b_hook.url
    )
    assert b_made.secret is not None

    first = forecast_services.run_forecast_pass(a.operator.pk, now=NOW)
    assert first.crossed == [f"gpu:{world_a['bad']}"]
    rows = _rows(a.operator.pk)
    assert sorted(r.channel.name for r in rows) == ["fleet", "hook"]
    assert {r.kind for r in rows} == {DeliveryKind.FORECAST}
    assert len({r.event_id for r in rows}) == 1
    assert delivery.deliver_due() == 2
    [request] = hook.wait_for(1)
    body = verify(made.secret, request)  # signed per Standard Webhooks, as a verdict is
    assert request.headers["webhook-id"] == rows[0].event_id
    assert body["family"] == services.FORECAST_FAMILY
    assert body["subject"]["gpu"] == world_a["bad"] and body["subject"]["node"] == world_a["n1"]
    assert body["forecast"]["previous_level"] == "ok"
    assert body["forecast"]["level"] in ("drain", "urgent")
    assert body["forecast"]["risk"]["7d"] >= 0.5
    assert "heading for XID 48" in body["summary"]
    assert {e["signal"] for e in body["evidence"]} >= {"single-bit ECC errors"}
    [chat] = slack.wait_for(1)
    text = chat.json()["text"]
    assert text.startswith(f"Fleet health: GPU {world_a['bad']} at ") and world_a["n1"] in text
    assert [r.state for r in _rows(a.operator.pk)] == [DeliveryState.SENT] * 2

    # Still at that level an hour later: nothing new owed.
    again = forecast_services.run_forecast_pass(a.operator.pk, now=NOW + 3600)
    assert again.crossed == []
    assert len(_rows(a.operator.pk)) == 2

    # Recovered (no new errors for three days): cleared, nothing sent for it.
    cleared = forecast_services.run_forecast_pass(a.operator.pk, now=NOW + 3 * DAY_S)
    assert f"gpu:{world_a['bad']}" in cleared.cleared
    assert len(_rows(a.operator.pk)) == 2

    # A second degradation of the same GPU later: a new crossing, notified again.
    _degrade_again(a, world_a["bad"], NOW + 3600)
    later = forecast_services.run_forecast_pass(a.operator.pk, now=NOW + 12 * DAY_S)
    assert later.crossed == [f"gpu:{world_a['bad']}"]
    rows = _rows(a.operator.pk)
    assert len(rows) == 4 and len({r.event_id for r in rows}) == 2
    assert delivery.deliver_due() == 2
    second = hook.wait_for(2)[1]
    assert verify(made.secret, second)["forecast"]["level_since"] > body["forecast"]["level_since"]
    slack.wait_for(2)

    assert customer.received == [] and jobs_only.received == []
    # b's own GPU of the same shape goes to b's channel only, when b's pass runs.
    assert b_hook.received == [] and _rows(b.operator.pk) == []
    forecast_services.run_forecast_pass(b.operator.pk, now=NOW)
    assert delivery.deliver_due() == 1
    [b_request] = b_hook.wait_for(1)
    assert verify(b_made.secret, b_request)["subject"]["gpu"] == world_b["bad"]
    assert len(hook.received) == 2


def test_the_rows_roll_back_with_the_forecast_pass(stack: ExitStack) -> None:
    a = make_tenant("nfr")
    _world(a)
    hook = stack.enter_context(running(Receiver()))
    services.do_create_channel(
        a.principal(a.operator_admin), name="hook", kind="webhook", target=hook.url
    )

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        assert forecast_services.run_forecast_pass(a.operator.pk, now=NOW).crossed
        assert len(_rows(a.operator.pk)) == 1  # written in the pass's transaction
        raise Abort
    assert _rows(a.operator.pk) == []
    with tenant_context(a.operator.pk):
        assert not ComponentForecast.objects.for_tenant(a.operator.pk).exists()
    # Its retry owes (and sends) the notification.
    assert forecast_services.run_forecast_pass(a.operator.pk, now=NOW).crossed
    assert delivery.deliver_due() == 1
    hook.wait_for(1)
