""" "Ask about this incident" over the API: a question is stored (202, pending) and audited,
answered by the task through the investigator (the same checks and validator as the
explanation) and read back; another operator, another customer of the same operator and a
customer on a fleet-health incident get 404; a blank or too long question is a 400 naming the
field; asking is rate-limited per user; read-only principals may read but not ask. The answer
task runs against a real chat-completions server on loopback (fast) and, once, the default local
model on a simulated slow_rank (slow)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from ingest.models import Job
from investigations import ask_services, explain_services, services
from investigations.models import Incident, IncidentQuestion, QuestionState
from investigations.tests.live_helpers import job_pk, store_gpu_job, store_sim, verdict
from investigator import validate
from investigator.ask import MAX_QUESTION_CHARS
from investigator.model import LlamaCppWriter, OpenAICompatibleWriter
from investigator.tests.chat_server import chat_server, cited_ids
from investigator.tools import run_procedure
from tenants.context import tenant_context
from tenants.models import AuditEvent, Customer, TokenScope
from tenants.testing import Tenant, make_second_customer, make_tenant

ANSWER = "Tensor pipes idle: sequence_imbalance observed [e1]."


@dataclass
class World:
    a: Tenant
    b: Tenant
    second: Customer
    second_admin: Any
    mine: Incident  # a's customer's job
    theirs: Incident  # a's second customer's job
    fleet: Incident  # a's fleet-health incident (no job)
    other: Incident  # b's


def _incident(tenant: Tenant, job: str | None, customer: Customer | None, family: str) -> Incident:
    op = tenant.operator.pk
    with tenant_context(op):
        if job is None:
            services.merge_verdicts(
                op,
                [verdict("gpu_degrading", "infrastructure", job=None, gpu="GPU-ask-1")],
                window_end=1_100,
                gpu="GPU-ask-1",
            )
            return Incident.objects.for_tenant(op).get(job__isnull=True)
    pk = store_gpu_job(op, job, f"{tenant.operator.slug}-{job}")
    with tenant_context(op):
        Job.objects.for_tenant(op).filter(pk=pk).update(customer=customer)
        services.merge_verdicts(op, [verdict(family, job=job)], window_end=1_100, job_pk=pk)
        return Incident.objects.for_tenant(op).get(job_id=pk)


@pytest.fixture(name="world")
def world_fixture() -> World:
    a, b = make_tenant("aska"), make_tenant("askb")
    second, second_admin = make_second_customer(a, "ask-second", "aska-second-admin")
    return World(
        a=a,
        b=b,
        second=second,
        second_admin=second_admin,
        mine=_incident(a, "job-mine", a.customer, "sequence_imbalance"),
        theirs=_incident(a, "job-theirs", second, "sequence_imbalance"),
        fleet=_incident(a, None, None, "gpu_degrading"),
        other=_incident(b, "job-other", b.customer, "sequence_imbalance"),
    )


def session(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _ask(client: APIClient, incident: Incident, question: Any = "Which rank is slow?") -> Any:
    return client.post(
        f"/api/v1/incidents/{incident.public_id}/questions/", {"question": question}, format="json"
    )


def _questions(incident: Incident) -> str:
    return f"/api/v1/incidents/{incident.public_id}/questions/"


@pytest.mark.django_db
def test_a_question_is_accepted_stored_audited_and_read_back(world: World) -> None:
    a = world.a
    api = session(a.operator_admin)
    response = _ask(api, world.mine, "  Which rank is slow?  ")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["state"] == "pending" and body["answer"] == "" and body["refused"] is False
    assert body["question"] == "Which rank is slow?"
    assert body["incident"] == str(world.mine.public_id)
    assert body["revision"] == world.mine.revision
    assert body["asked_by"] == a.operator_admin.username
    got = api.get(f"{_questions(world.mine)}{body['id']}/")
    assert got.status_code == 200 and got.json()["id"] == body["id"]
    listed = api.get(_questions(world.mine)).json()["results"]
    assert [q["id"] for q in listed] == [body["id"]]
    with tenant_context(a.operator.pk):
        audit = AuditEvent.objects.for_tenant(a.operator.pk).get(action="incident.question_asked")
    assert audit.target_id == str(world.mine.public_id)
    assert audit.actor == a.operator_admin.username
    assert audit.detail == {"question": body["id"], "text": "Which rank is slow?"}
    assert audit.customer_id == a.customer.pk


@pytest.mark.django_db
def test_other_tenants_and_other_customers_are_refused(world: World) -> None:
    a = world.a
    asked = _ask(session(a.operator_admin), world.mine).json()["id"]
    detail = f"{_questions(world.mine)}{asked}/"
    # another operator: 404 for its POST, the list and the question itself
    other = session(world.b.operator_admin)
    assert _ask(other, world.mine).status_code == 404
    assert other.get(_questions(world.mine)).status_code == 404
    assert other.get(detail).status_code == 404
    # the question's id under the other operator's own incident: 404 too
    assert other.get(f"{_questions(world.other)}{asked}/").status_code == 404
    # a customer of the same operator on another customer's incident, and on a fleet incident
    customer = session(a.customer_admin)
    for foreign in (world.theirs, world.fleet):
        assert _ask(customer, foreign).status_code == 404
        assert customer.get(_questions(foreign)).status_code == 404
    assert session(world.second_admin).get(detail).status_code == 404
    # the customer on its own job's incident: asks and reads
    own = _ask(customer, world.mine)
    assert own.status_code == 202, own.content
    assert len(customer.get(_questions(world.mine)).json()["results"]) == 2
    # a customer viewer and a read-only token may read, not ask (403)
    viewer = session(a.customer_viewer)
    assert viewer.get(detail).status_code == 200
    assert _ask(viewer, world.mine).status_code == 403
    read_only = bearer(a.api_token(a.operator_admin, scope=TokenScope.READ))
    assert _ask(read_only, world.mine).status_code == 403
    # a foreign incident is 404 before its body is read (a bad body changes nothing)
    assert _ask(other, world.mine, "").status_code == 404
    assert other.get(f"{_questions(world.mine)}not-a-uuid/").status_code == 404


@pytest.mark.django_db
def test_a_blank_or_too_long_question_is_a_400_naming_it(world: World) -> None:
    api = session(world.a.operator_admin)
    for question, problem in (
        ("", "may not be blank"),
        ("x" * (MAX_QUESTION_CHARS + 1), f"no more than {MAX_QUESTION_CHARS} characters"),
    ):
        response = _ask(api, world.mine, question)
        assert response.status_code == 400
        fields = response.json()["error"]["fields"]
        assert list(fields) == ["question"] and problem in fields["question"][0], fields
    missing = api.post(_questions(world.mine), {}, format="json")
    assert missing.status_code == 400 and "question" in missing.json()["error"]["fields"]
    with tenant_context(world.a.operator.pk):
        assert not IncidentQuestion.objects.for_tenant(world.a.operator.pk).exists()


@pytest.mark.django_db
def test_asking_is_rate_limited_per_user(world: World, settings: Any) -> None:
    settings.PROOF_ASK_RATE = "2/hour"
    api = session(world.a.operator_admin)
    assert [_ask(api, world.mine).status_code for _ in range(2)] == [202, 202]
    limited = _ask(api, world.mine)
    assert limited.status_code == 429
    assert int(limited["Retry-After"]) > 0
    # reading is not counted, and another user has a budget of its own
    assert api.get(_questions(world.mine)).status_code == 200
    assert _ask(session(world.a.operator_support), world.mine).status_code == 202


@pytest.mark.django_db(transaction=True)
def test_the_task_is_enqueued_after_commit(world: World, start_task_worker: Any) -> None:
    """The question's task runs on a real (in-process) worker once the request committed; with
    an out-of-scope question it is refused without any model."""
    start_task_worker()
    response = _ask(session(world.a.operator_admin), world.mine, "Will it rain tomorrow?")
    assert response.status_code == 202
    url = f"{_questions(world.mine)}{response.json()['id']}/"
    api = session(world.a.operator_admin)
    body = _wait_answered(api, url)
    assert body["state"] == "refused" and body["refused"] is True
    assert body["answer"].startswith("The evidence does not say anything about 'rain'")
    assert body["reason"] == "out of scope" and body["cited"] == []


def _wait_answered(api: APIClient, url: str, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        body: dict[str, Any] = api.get(url).json()
        if body["state"] != "pending" or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


@pytest.mark.django_db
def test_the_answer_is_validated_cited_and_stored_once(world: World) -> None:
    op = world.a.operator.pk
    row = ask_services.do_ask(
        world.a.principal(world.a.operator_admin),
        world.mine.public_id,
        "What do the tensor pipes show?",
    )

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        assert "e1" in cited_ids(body)
        return {"answerable": True, "answer": ANSWER, "cited": ["e1"]}

    with chat_server(respond) as server:
        writer = OpenAICompatibleWriter(server.url)
        # another operator's call finds nothing
        assert ask_services.answer_question(world.b.operator.pk, row.pk, writer) == "missing"
        assert ask_services.answer_question(op, row.pk, writer) == "answered"
        # a second delivery of the task changes nothing
        assert ask_services.answer_question(op, row.pk, writer) == "done"
        assert len(server.requests) == 1
    with tenant_context(op):
        row.refresh_from_db()
    assert row.state == QuestionState.ANSWERED and row.validated and not row.refused
    assert row.answer == ANSWER and row.cited == ["e1"]
    assert row.detail["attempts"] == 1 and row.detail["tokens"]["prompt"] == 600
    assert row.duration_s is not None and row.answered_at is not None
    body = session(world.a.customer_admin).get(f"{_questions(world.mine)}{row.public_id}/").json()
    assert {k: body[k] for k in ("state", "answer", "cited", "validated", "refused")} == {
        "state": "answered",
        "answer": ANSWER,
        "cited": ["e1"],
        "validated": True,
        "refused": False,
    }


@pytest.mark.django_db
def test_an_unanswerable_question_is_refused_plainly(world: World) -> None:
    op = world.a.operator.pk
    principal = world.a.principal(world.a.operator_admin)
    row = ask_services.do_ask(
        principal, world.mine.public_id, "What is the customer's credit card?"
    )
    with chat_server(lambda body: pytest.fail("the model was asked")) as server:
        state = ask_services.answer_question(op, row.pk, OpenAICompatibleWriter(server.url))
    assert state == "refused"
    with tenant_context(op):
        row.refresh_from_db()
    assert row.refused and not row.validated and row.cited == []
    assert row.answer.startswith("The evidence does not say anything about ")
    assert "'credit'" in row.answer


@pytest.mark.django_db
def test_a_question_left_pending_is_refused_in_the_end(world: World) -> None:
    op = world.a.operator.pk
    principal = world.a.principal(world.a.operator_admin)
    old = ask_services.do_ask(principal, world.mine.public_id, "Which rank is slow?")
    new = ask_services.do_ask(principal, world.mine.public_id, "Which node is it?")
    with tenant_context(op):
        IncidentQuestion.objects.for_tenant(op).filter(pk=old.pk).update(
            created_at=old.created_at - timedelta(seconds=ask_services.STALE_S + 1)
        )
    assert ask_services.expire_stale_questions() == 1
    with tenant_context(op):
        old.refresh_from_db()
        new.refresh_from_db()
    assert old.state == QuestionState.REFUSED and "not answered in time" in old.answer
    assert new.state == QuestionState.PENDING


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_default_model_answers_a_question_about_a_live_slow_rank() -> None:
    a = make_tenant("ask-live")
    op = a.operator.pk
    sim = store_sim(op, "slow_rank", duration_s=300, nodes=2, gpus_per_node=4, seed=0)
    services.evaluate_job(op, job_pk(op, sim.jobs[0]))
    with tenant_context(op):
        incident = Incident.objects.for_tenant(op).get(family="slow_rank")
    principal = a.principal(a.operator_admin)
    row = ask_services.do_ask(principal, incident.public_id, "Which rank is slow, and since when?")
    state = ask_services.answer_question(op, row.pk, LlamaCppWriter())
    with tenant_context(op):
        row.refresh_from_db()
    assert state in ("answered", "refused")
    assert row.detail["model"] == "llama.cpp:gemma-3-270m-q4_k_m.gguf"
    assert 1 <= row.detail["attempts"] <= 2
    assert row.validated != row.refused
    if row.validated:
        # every number, rank, node, time and id in what is published is the evidence's
        window = explain_services.job_window(op, incident)
        steps = run_procedure(incident.verdict, window)
        ranks = [r.rank for r in window.ranks] if window is not None else []
        facts = validate.collect_facts(incident.verdict, steps, ranks)
        assert validate.check_text(row.answer, facts) == []
        assert row.cited and set(row.cited) <= facts.ids
    else:
        assert row.answer.startswith("The evidence does not")
        assert row.reason
    print(f"\nask on the default model: {state} in {row.duration_s} s: {row.answer!r}")
