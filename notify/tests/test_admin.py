"""Staff see every operator's channels and deliveries, never a channel's target or secret."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from notify import services
from notify.models import OutboxDelivery
from tenants.context import system_context
from tenants.testing import TEST_PASSWORD, make_tenant

pytestmark = pytest.mark.django_db


def test_staff_lists_channels_and_deliveries_without_credentials(client: Client) -> None:
    get_user_model().objects.create_user(
        username="staff", password=TEST_PASSWORD, is_staff=True, is_superuser=True
    )
    assert client.login(username="staff", password=TEST_PASSWORD)
    made = []
    for slug in ("nad-a", "nad-b"):
        tenant = make_tenant(slug)
        principal = tenant.principal(tenant.operator_admin)
        created = services.do_create_channel(
            principal,
            name=f"{slug} hook",
            kind="webhook",
            target=f"https://hooks.example/{slug}/s3cr3t-path",
        )
        services.do_send_test(principal, created.channel)
        made.append(created)
    body = client.get("/admin/notify/notificationchannel/").content.decode()
    assert "nad-a hook" in body and "nad-b hook" in body
    detail = client.get(f"/admin/notify/notificationchannel/{made[0].channel.pk}/change/")
    assert detail.status_code == 200
    text = detail.content.decode()
    assert "s3cr3t-path" not in text and str(made[0].secret) not in text
    with system_context():
        event_ids = list(OutboxDelivery.objects.values_list("event_id", flat=True))
    body = client.get("/admin/notify/outboxdelivery/").content.decode()
    assert all(e in body for e in event_ids) and len(event_ids) == 2
