"""The staff admin site works under row-level security (it runs in system context)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tenants.context import system_context
from tenants.models import AgentToken, Membership, Operator, Role
from tenants.services import resolve_agent_token
from tenants.testing import TEST_PASSWORD, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client: Client) -> Client:
    get_user_model().objects.create_user(
        username="staff", password=TEST_PASSWORD, is_staff=True, is_superuser=True
    )
    assert client.login(username="staff", password=TEST_PASSWORD)
    return client


def test_staff_lists_every_operator_and_customer(staff_client: Client) -> None:
    make_tenant("north")
    make_tenant("south")
    body = staff_client.get("/admin/tenants/operator/").content.decode()
    assert "Operator north" in body and "Operator south" in body
    body = staff_client.get("/admin/tenants/customer/").content.decode()
    assert "Customer north-customer" in body and "Customer south-customer" in body


def test_staff_adds_operator_with_first_admin(staff_client: Client) -> None:
    response = staff_client.post(
        "/admin/tenants/operator/add/",
        {
            "name": "West Cloud",
            "slug": "west",
            "admin_username": "west-admin",
            "admin_email": "",
            "admin_password": "a-long-admin-passphrase",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    with system_context():
        operator = Operator.objects.get(slug="west")
        membership = Membership.objects.get(user__username="west-admin")
    assert (membership.operator_id, membership.role) == (operator.pk, Role.OPERATOR_ADMIN)


def test_staff_creates_agent_token_shown_once(staff_client: Client) -> None:
    tenant = make_tenant("east")
    response = staff_client.post(
        "/admin/tenants/agenttoken/add/",
        {"operator": tenant.operator.pk, "name": "rack 3"},
        follow=True,
    )
    messages = [str(m) for m in response.context["messages"]]
    plaintext = next(m for m in messages if "Agent token" in m).split(": ", 1)[1].split(" ")[0]
    assert resolve_agent_token(plaintext) == tenant.operator.pk
    with system_context():
        assert AgentToken.objects.get(operator=tenant.operator).name == "rack 3"


def test_member_without_staff_flag_cannot_use_admin(client: Client) -> None:
    make_tenant("quiet")
    assert client.login(username="quiet-op-admin", password=TEST_PASSWORD)
    response = client.get("/admin/tenants/operator/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
