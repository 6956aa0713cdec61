"""/api/v1/notification-channels/: operator admins write, operator roles read, customers and
other operators never see a channel (404); the secret is shown once; test events go through
the outbox to a real receiver; the delivery log is paginated."""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from notify import delivery
from notify.models import ChannelSecret, NotificationChannel, OutboxDelivery
from notify.tests.receivers import Receiver, running, verify
from tenants.context import system_context
from tenants.testing import Tenant, make_tenant

BASE = "/api/v1/notification-channels/"


def session(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def _create(client: APIClient, **body: Any) -> Any:
    return client.post(BASE, body, format="json")


@pytest.mark.django_db
def test_crud_secret_once_and_tenants_refused() -> None:
    a, b = make_tenant("napi-a"), make_tenant("napi-b")
    admin = session(a.operator_admin)
    made = _create(
        admin,
        name="Fleet webhook",
        kind="webhook",
        target="https://hooks.napi-a.example/proof/abcdef123456",
        rules=[{"families": ["hardware_fault"], "min_gpu_hours_lost": 1.5}],
    )
    assert made.status_code == 201, made.content
    secret = made.json()["secret"]
    assert secret.startswith("whsec_")
    channel_id = made.json()["id"]
    assert made.json()["rules"][0]["families"] == ["hardware_fault"]
    url = f"{BASE}{channel_id}/"
    # Never again: neither the detail nor the list shows the secret; the target is masked.
    detail = admin.get(url).json()
    assert "secret" not in detail and detail["target"] == "…3456"
    assert all("secret" not in c for c in admin.get(BASE).json()["results"])
    # Operator support reads, does not write.
    support = session(a.operator_support)
    assert support.get(url).status_code == 200
    assert support.patch(url, {"enabled": False}, format="json").status_code == 403
    assert _create(support, name="x", kind="slack", target="https://x.example/h").status_code == 403
    # Another operator and a customer of the same operator: 404 for every channel URL.
    b_admin = session(b.operator_admin)
    customer = session(a.customer_admin)
    viewer = session(a.customer_viewer)
    for client in (b_admin, customer, viewer):
        assert client.get(url).status_code == 404
        assert client.get(f"{url}deliveries/").status_code == 404
        assert client.get(BASE).json()["results"] == []
    for client in (b_admin, customer):
        assert client.patch(url, {"name": "mine now"}, format="json").status_code == 404
        assert client.delete(url).status_code == 404
        assert client.post(f"{url}test/").status_code == 404
        assert client.post(f"{url}rotate-secret/").status_code == 404
    assert (
        _create(customer, name="x", kind="slack", target="https://x.example/h").status_code == 403
    )
    # b's own channel is b's alone.
    b_made = _create(b_admin, name="B chat", kind="slack", target="https://hooks.slack.example/b")
    assert b_made.status_code == 201 and "secret" not in b_made.json()
    assert [c["name"] for c in admin.get(BASE).json()["results"]] == ["Fleet webhook"]
    # Update: rules replaced, kind fixed; bad input is a 400 naming the field.
    changed = admin.patch(
        url, {"name": "Renamed", "rules": [{"categories": ["infrastructure"]}]}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["name"] == "Renamed"
    assert changed.json()["rules"] == [
        {
            "families": [],
            "categories": ["infrastructure"],
            "customer": None,
            "min_gpu_hours_lost": None,
            "min_money_lost": None,
        }
    ]
    bad = _create(admin, name="bad", kind="slack", target="not a url")
    assert bad.status_code == 400 and "webhook URL" in bad.json()["error"]["message"]
    other_customer = admin.patch(url, {"rules": [{"customer": b.customer.pk}]}, format="json")
    assert other_customer.status_code == 400
    # Rotation: a new secret, returned once; the old one stays active for the overlap.
    rotated = admin.post(f"{url}rotate-secret/")
    assert rotated.status_code == 200 and rotated.json()["secret"] != secret
    with system_context():
        assert ChannelSecret.objects.filter(channel_id=channel_id).count() == 2
    assert admin.delete(url).status_code == 204
    with system_context():
        assert not NotificationChannel.objects.filter(pk=channel_id).exists()


@pytest.mark.django_db(transaction=True)
def test_test_event_through_the_outbox_and_the_delivery_log(settings: Any) -> None:
    settings.PROOF_NOTIFY_TIMEOUT_S = 1.0
    a = make_tenant("napt-a")
    admin = session(a.operator_admin)
    with ExitStack() as stack:
        hook = stack.enter_context(running(Receiver()))
        made = _create(admin, name="Hook", kind="webhook", target=hook.url).json()
        url = f"{BASE}{made['id']}/"
        for _ in range(3):
            queued = admin.post(f"{url}test/")
            assert queued.status_code == 202 and queued.json()["state"] == "pending"
        delivery.deliver_due()
        requests = hook.wait_for(3)
        bodies = [verify(made["secret"], r) for r in requests]
        assert {b["family"] for b in bodies} == {"test"}
    page = admin.get(f"{url}deliveries/?page_size=2").json()
    assert len(page["results"]) == 2 and page["next"]
    rest = admin.get(page["next"]).json()
    assert len(rest["results"]) == 1 and rest["next"] is None
    row = page["results"][0]
    assert (row["kind"], row["state"], row["attempts"], row["last_status"]) == (
        "test",
        "sent",
        1,
        200,
    )
    with system_context():
        assert OutboxDelivery.objects.filter(operator_id=a.operator.pk).count() == 3


@pytest.mark.django_db(transaction=True)
def test_after_commit_kick_delivers_without_waiting_for_the_periodic_pass(
    start_task_worker: Any, settings: Any
) -> None:
    settings.PROOF_NOTIFY_TIMEOUT_S = 1.0
    a: Tenant = make_tenant("napk-a")
    admin = session(a.operator_admin)
    start_task_worker()
    with running(Receiver()) as chat:
        made = _create(admin, name="Chat", kind="slack", target=chat.url).json()
        queued_at = time.monotonic()
        admin.post(f"{BASE}{made['id']}/test/")
        [request] = chat.wait_for(1, timeout_s=10)
        # No periodic pass runs here: the after-commit kick alone delivered it, in well under
        # the 5 s the periodic pass would take at worst.
        latency = request.at - queued_at
        print(f"test event: request to receiver in {latency:.3f} s")
        assert latency < 3.0
        assert request.json()["blocks"][0]["text"]["text"].startswith("Test: ")
