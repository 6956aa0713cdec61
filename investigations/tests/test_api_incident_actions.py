"""Incident actions over the API, on incidents the live pipeline wrote from simulated runs:
acknowledge, assign, comment, link tickets, resolve, reopen — each in the incident's history
with who and when, and in the audit log; invalid transitions 409 naming the state; who may act
(operators everything, a customer's admin comments and links tickets on its own incidents);
read-only tokens refused; another operator and another customer get 404; bad input names the
field; the list and history query counts do not grow with rows."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from ingest import services as ingest_services
from ingest.models import Job
from investigations import notifications, services, window_cache
from investigations.models import Incident, IncidentEvent, IncidentState, RevisionKind
from investigations.tests.live_helpers import job_pk, store_sim
from tenants.context import tenant_context
from tenants.models import AuditEvent, Customer, TokenScope
from tenants.testing import Tenant, make_second_customer, make_tenant
from tenants.tokens import display_prefix

pytestmark = pytest.mark.django_db

ACTIONS: list[tuple[str, dict[str, Any]]] = [
    ("acknowledge", {}),
    ("resolve", {"reason": "drained"}),
    ("reopen", {}),
    ("assign", {"user": None}),
    ("comments", {"body": "looking"}),
    ("link-ticket", {"system": "jira", "ticket_id": "OPS-1", "url": "https://jira.example/OPS-1"}),
]


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    # On SQLite a rolled-back test's row ids are given out again: no cached identity may be
    # another test's.
    ingest_services.clear_caches()
    window_cache.CACHE.clear()


@dataclass
class World:
    a: Tenant
    b: Tenant
    second: Customer  # a's other customer
    second_admin: Any
    mine: Incident  # a's customer's job (slow_rank)
    theirs: Incident  # a's second customer's job (hardware_fault)
    other: Incident  # b's


def evaluate(tenant: Tenant, scenario: str, customer: Customer | None, seed: int = 1) -> Incident:
    """Simulate `scenario`, store it through ingest, evaluate it with the real detectors: the
    incident the pipeline opened for it."""
    op = tenant.operator.pk
    sim = store_sim(op, scenario, seed=seed, agent_id=f"{tenant.operator.slug}-{scenario}-{seed}")
    if customer is not None:
        with tenant_context(op):
            Job.objects.for_tenant(op).filter(job_id=sim.jobs[0]).update(customer=customer)
    pk = job_pk(op, sim.jobs[0])
    services.evaluate_job(op, pk)
    with tenant_context(op):
        return Incident.objects.for_tenant(op).get(job_id=pk, family=scenario)


@pytest.fixture(name="world")
def world_fixture() -> World:
    """Two operators; a's customer's slow_rank incident, a's second customer's hardware_fault
    incident, b's slow_rank incident — each opened by the pipeline (shared by the API tests)."""
    a, b = make_tenant("iaa"), make_tenant("iab")
    second, second_admin = make_second_customer(a, "second", "iaa-second-admin")
    return World(
        a=a,
        b=b,
        second=second,
        second_admin=second_admin,
        mine=evaluate(a, "slow_rank", a.customer),
        theirs=evaluate(a, "hardware_fault", second),
        other=evaluate(b, "slow_rank", b.customer, seed=2),
    )


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def session(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def act(
    client: APIClient, incident: Incident, action: str, body: dict[str, Any] | None = None
) -> Any:
    return client.post(
        f"/api/v1/incidents/{incident.public_id}/{action}/", body or {}, format="json"
    )


def history(client: APIClient, incident: Incident) -> list[dict[str, Any]]:
    response = client.get(f"/api/v1/incidents/{incident.public_id}/history/")
    assert response.status_code == 200, response.content
    results: list[dict[str, Any]] = response.json()["results"]
    return results


def fields_of(response: Any) -> dict[str, list[str]]:
    fields: dict[str, list[str]] = response.json()["error"].get("fields", {})
    return fields


def test_operator_works_an_incident_from_acknowledge_to_resolve(world: World) -> None:
    a = world.a
    assert world.mine.state == IncidentState.OPEN
    support = a.operator_support
    support.email = "support@iaa.example"
    support.save()
    token = a.api_token(a.operator_support, scope=TokenScope.READ_WRITE)
    api = bearer(token)
    prefix = display_prefix(token)

    acked = act(api, world.mine, "acknowledge")
    assert acked.status_code == 200, acked.content
    assert acked.json()["acknowledged_by"] == f"api-token:{prefix}"
    assert acked.json()["acknowledged_at"] is not None

    # By username, then by e-mail (case-insensitive), then to nobody.
    assigned = act(api, world.mine, "assign", {"user": a.operator_admin.username})
    assert assigned.status_code == 200 and assigned.json()["assignee"] == a.operator_admin.username
    by_mail = act(api, world.mine, "assign", {"user": "SUPPORT@iaa.example"})
    assert by_mail.status_code == 200 and by_mail.json()["assignee"] == support.username

    comment = act(api, world.mine, "comments", {"body": "  Customer reports 20% slower steps. "})
    assert comment.status_code == 201, comment.content
    assert comment.json()["payload"] == {"body": "Customer reports 20% slower steps."}

    ticket = {"system": "zendesk", "ticket_id": "48812", "url": "https://z.example/t/48812"}
    first = act(api, world.mine, "link-ticket", ticket)
    again = act(api, world.mine, "link-ticket", {**ticket, "url": "https://elsewhere.example/"})
    jira = act(api, world.mine, "link-ticket", {"system": "jira", "ticket_id": "48812"})
    assert (first.status_code, again.status_code, jira.status_code) == (201, 200, 201)
    assert again.json()["url"] == ticket["url"]  # linking again changes nothing

    # The pipeline's resolve is announced in the transaction (notify writes the PagerDuty
    # resolve outbox row from it): a person's resolve is announced the same way.
    announced: list[notifications.Notification] = []

    def hear(sender: Any, *, notification: notifications.Notification, **kwargs: Any) -> None:
        announced.append(notification)

    notifications.notification_in_transaction.connect(hear)
    try:
        resolved = act(
            session(a.operator_admin),
            world.mine,
            "resolve",
            {"reason": "GPU replaced", "note": "RMA 7"},
        )
    finally:
        notifications.notification_in_transaction.disconnect(hear)
    assert resolved.status_code == 200, resolved.content
    body = resolved.json()
    assert body["state"] == "resolved" and body["resolve_reason"] == "manual"
    assert [t["ticket_id"] for t in body["tickets"]] == ["48812", "48812"]
    assert [(n.kind, n.incident_public_id) for n in announced] == [
        ("resolved", str(world.mine.public_id))
    ]
    with tenant_context(a.operator.pk):
        incident = Incident.objects.for_tenant(a.operator.pk).get(pk=world.mine.pk)
        assert incident.revisions.order_by("-number").first().kind == RevisionKind.RESOLVED  # type: ignore[union-attr]

    events = history(session(a.operator_support), world.mine)
    assert [e["kind"] for e in events] == [
        "acknowledged",
        "assigned",
        "assigned",
        "commented",
        "ticket_linked",
        "ticket_linked",
        "resolved",
    ]
    assert {e["actor"] for e in events[:-1]} == {f"api-token:{prefix}"}
    assert events[-1]["actor"] == a.operator_admin.username
    assert events[-1]["payload"] == {"reason": "GPU replaced", "note": "RMA 7"}
    assert events[2]["payload"] == {
        "assignee": support.username,
        "previous": a.operator_admin.username,
    }
    assert all(e["at"] for e in events) and events == sorted(
        events, key=lambda e: (e["at"], e["id"])
    )
    # Each action is in the audit log too, with the customer it concerned.
    with tenant_context(a.operator.pk):
        audit = list(
            AuditEvent.objects.for_tenant(a.operator.pk)
            .filter(target_id=str(world.mine.public_id))
            .order_by("at", "id")
            .values_list("action", "actor", "customer_id")
        )
    assert [row[0] for row in audit] == [f"incident.{e['kind']}" for e in events]
    assert {row[2] for row in audit} == {a.customer.pk}
    assert audit[-1][1] == a.operator_admin.username


def test_invalid_transitions_are_409_naming_the_state(world: World) -> None:
    api = session(world.a.operator_admin)
    reopen_open = act(api, world.mine, "reopen")
    assert reopen_open.status_code == 409
    assert reopen_open.json()["error"]["code"] == "conflict"
    assert "is open" in reopen_open.json()["error"]["message"]

    assert act(api, world.mine, "acknowledge").status_code == 200
    twice = act(api, world.mine, "acknowledge")
    assert twice.status_code == 409 and "already acknowledged" in twice.json()["error"]["message"]

    assert act(api, world.mine, "resolve").status_code == 200
    for action in ("resolve", "acknowledge"):
        refused = act(api, world.mine, action)
        assert refused.status_code == 409, action
        assert "resolved" in refused.json()["error"]["message"], action

    # Reopened: open again and no longer acknowledged; it can be worked (and resolved) again.
    reopened = act(api, world.mine, "reopen")
    assert reopened.status_code == 200
    assert reopened.json()["state"] == "open" and reopened.json()["acknowledged_at"] is None
    assert reopened.json()["resolve_reason"] == ""
    assert act(api, world.mine, "acknowledge").status_code == 200
    assert act(api, world.mine, "resolve").status_code == 200
    kinds = [e["kind"] for e in history(api, world.mine)]
    assert kinds == ["acknowledged", "resolved", "reopened", "acknowledged", "resolved"]
    # Refused actions recorded nothing.
    with tenant_context(world.a.operator.pk):
        assert IncidentEvent.objects.for_tenant(world.a.operator.pk).count() == 5


def test_reopen_refused_while_the_pipeline_has_another_incident_open(world: World) -> None:
    api = session(world.a.operator_admin)
    assert act(api, world.mine, "resolve").status_code == 200
    op = world.a.operator.pk
    with tenant_context(op):
        # The finding came back: the pipeline opened a new incident for the same job and family.
        newer = Incident.objects.for_tenant(op).get(pk=world.mine.pk)
        newer.pk = None
        newer.public_id = uuid.uuid4()
        newer.state = IncidentState.OPEN
        newer.resolved_at = None
        newer.resolve_reason = ""
        newer.save()
    refused = act(api, world.mine, "reopen")
    assert refused.status_code == 409
    assert str(newer.public_id) in refused.json()["error"]["message"]


def test_another_operator_gets_404_on_every_action_and_read(world: World) -> None:
    for client in (
        bearer(world.b.api_token(world.b.operator_admin)),
        session(world.b.operator_admin),
    ):
        for action, body in ACTIONS:
            response = act(client, world.mine, action, body)
            assert response.status_code == 404, (action, response.content)
            # A body that would be refused is not even read: the id is not theirs.
            assert (
                act(client, world.mine, action, {"body": "", "user": 7, "system": 1}).status_code
                == 404
            )
        for read in ("history", "evidence-series", ""):
            path = f"/api/v1/incidents/{world.mine.public_id}/{read + '/' if read else ''}"
            assert client.get(path).status_code == 404, read
    with tenant_context(world.a.operator.pk):
        assert not IncidentEvent.objects.for_tenant(world.a.operator.pk).exists()
        assert (
            Incident.objects.for_tenant(world.a.operator.pk).get(pk=world.mine.pk).state == "open"
        )


def test_customers_comment_and_link_tickets_on_their_own_incidents_only(world: World) -> None:
    a = world.a
    admin = bearer(a.api_token(a.customer_admin))
    assert act(admin, world.mine, "comments", {"body": "we see it too"}).status_code == 201
    linked = act(admin, world.mine, "link-ticket", {"system": "freshdesk", "ticket_id": "F-9"})
    assert linked.status_code == 201 and linked.json()["linked_by"].startswith("api-token:prf_")
    for action, body in ACTIONS[:4]:
        refused = act(admin, world.mine, action, body)
        assert refused.status_code == 403, action
        assert "only operator roles" in refused.json()["error"]["message"]
    # Another customer's incident (and a fleet-health one) does not exist for this customer.
    for action, body in ACTIONS:
        assert act(admin, world.theirs, action, body).status_code == 404, action
        assert act(session(world.second_admin), world.mine, action, body).status_code == 404
    assert [e["kind"] for e in history(admin, world.mine)] == ["commented", "ticket_linked"]
    assert admin.get(f"/api/v1/incidents/{world.theirs.public_id}/history/").status_code == 404
    # A customer viewer reads the history and may not act.
    viewer = session(a.customer_viewer)
    assert len(history(viewer, world.mine)) == 2
    assert act(viewer, world.mine, "comments", {"body": "x"}).status_code == 403


def test_read_only_tokens_cannot_act(world: World) -> None:
    a = world.a
    for user in (a.operator_admin, a.operator_support, a.customer_admin):
        reader = bearer(a.api_token(user, scope=TokenScope.READ))
        for action, body in ACTIONS:
            assert act(reader, world.mine, action, body).status_code == 403, (user, action)
        assert history(reader, world.mine) == []


def test_bad_input_names_the_field(world: World) -> None:
    api = session(world.a.operator_admin)
    unknown = act(api, world.mine, "assign", {"user": "nobody-here"})
    assert unknown.status_code == 400 and "nobody-here" in fields_of(unknown)["user"][0]
    # Customer users are not assignees: the incident is the operator's to work.
    customer = act(api, world.mine, "assign", {"user": world.a.customer_admin.username})
    assert customer.status_code == 400 and "user" in fields_of(customer)
    assert "user" in fields_of(act(api, world.mine, "assign", {}))
    assert "body" in fields_of(act(api, world.mine, "comments", {"body": "   "}))
    bad_system = act(api, world.mine, "link-ticket", {"system": "trello", "ticket_id": "1"})
    assert bad_system.status_code == 400 and "system" in fields_of(bad_system)
    bad_url = act(
        api, world.mine, "link-ticket", {"system": "jira", "ticket_id": "1", "url": "not a url"}
    )
    assert "url" in fields_of(bad_url)
    assert "ticket_id" in fields_of(act(api, world.mine, "link-ticket", {"system": "jira"}))
    long_reason = act(api, world.mine, "resolve", {"reason": "x" * 501})
    assert long_reason.status_code == 400 and "reason" in fields_of(long_reason)
    with tenant_context(world.a.operator.pk):  # nothing was resolved
        assert (
            Incident.objects.for_tenant(world.a.operator.pk).get(pk=world.mine.pk).state == "open"
        )
    assert history(api, world.mine) == []


def test_incident_list_filters_by_assignee_and_acknowledgement(world: World) -> None:
    api = session(world.a.operator_admin)
    act(api, world.mine, "assign", {"user": world.a.operator_support.username})
    act(api, world.mine, "acknowledge")

    def ids(query: str) -> set[str]:
        response = api.get(f"/api/v1/incidents/{query}")
        assert response.status_code == 200, response.content
        return {row["id"] for row in response.json()["results"]}

    mine, theirs = str(world.mine.public_id), str(world.theirs.public_id)
    assert ids(f"?assignee={world.a.operator_support.username}") == {mine}
    assert theirs in ids("?assignee=none") and mine not in ids("?assignee=none")
    assert ids("?acknowledged=true") == {mine}
    assert mine not in ids("?acknowledged=false") and theirs in ids("?acknowledged=false")
    bad = api.get("/api/v1/incidents/?acknowledged=yes")
    assert bad.status_code == 400 and "acknowledged" in fields_of(bad)


def _queries(client: APIClient, path: str) -> tuple[int, dict[str, Any]]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path)
    assert response.status_code == 200, response.content
    return len(captured.captured_queries), response.json()


def test_list_and_history_query_counts_do_not_grow_with_rows(world: World) -> None:
    api = session(world.a.operator_admin)
    act(api, world.mine, "link-ticket", {"system": "jira", "ticket_id": "A-1"})
    act(api, world.mine, "assign", {"user": world.a.operator_support.username})
    few, listed = _queries(api, "/api/v1/incidents/")
    few_history, _ = _queries(api, f"/api/v1/incidents/{world.mine.public_id}/history/")
    # More incidents (each assigned, each with tickets) and many more events.
    for seed, scenario in ((3, "checkpoint_stall"), (4, "sequence_imbalance")):
        incident = evaluate(world.a, scenario, world.a.customer, seed=seed)
        act(api, incident, "assign", {"user": world.a.operator_admin.username})
        for n in range(3):
            act(api, incident, "link-ticket", {"system": "other", "ticket_id": f"{seed}-{n}"})
    for n in range(12):
        act(api, world.mine, "comments", {"body": f"comment {n}"})
    many, listed_more = _queries(api, "/api/v1/incidents/")
    many_history, events = _queries(api, f"/api/v1/incidents/{world.mine.public_id}/history/")
    assert len(listed_more["results"]) == len(listed["results"]) + 2
    assert len(events["results"]) == 14
    assert many == few, (few, many)
    assert many_history == few_history, (few_history, many_history)
    # The customer's list: the same fixed count.
    customer_few, mine_only = _queries(session(world.a.customer_viewer), "/api/v1/incidents/")
    assert {r["id"] for r in mine_only["results"]} >= {str(world.mine.public_id)}
    assert str(world.theirs.public_id) not in {r["id"] for r in mine_only["results"]}
    assert customer_few <= many + 1


def test_share_link_changes_are_in_the_audit_log(world: World) -> None:
    api = session(world.a.customer_admin)
    made = api.post(
        "/api/v1/share-links/",
        {"incident": str(world.mine.public_id), "expires_in_s": 3600},
        format="json",
    )
    assert made.status_code == 201, made.content
    link = made.json()["id"]
    assert api.delete(f"/api/v1/share-links/{link}/").status_code == 204
    log = session(world.a.operator_admin).get("/api/v1/audit-log/?action=share_link.").json()
    assert [(e["action"], e["actor"], e["target_id"]) for e in log["results"]] == [
        ("share_link.revoke", world.a.customer_admin.username, str(link)),
        ("share_link.create", world.a.customer_admin.username, str(link)),
    ]
    assert log["results"][1]["detail"]["incident"] == str(world.mine.public_id)
    assert log["results"][1]["customer"] == world.a.customer.pk
    # The other operator's log has none of it.
    other = session(world.b.operator_admin).get("/api/v1/audit-log/?action=share_link.").json()
    assert other["results"] == []
