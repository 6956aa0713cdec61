"""The outbox end to end: rows written in the evaluation's transaction, the worker's sends to
real local receivers of every kind, retries, 410, timeouts, exactly once, tenants apart."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from decimal import Decimal
from typing import Any

import pytest
from django.core import mail
from django.db import connection, transaction

from investigations import services as inv
from investigations.models import GpuListPrice, Incident, NotificationLog
from investigations.tests.live_helpers import (
    job_pk,
    run_together,
    store_gpu_job,
    store_sim,
    verdict,
)
from notify import delivery, formats, services
from notify.models import DeliveryState, NotificationChannel, OutboxDelivery
from notify.tests.receivers import InvalidSignature, Receiver, running, smtp_server, verify
from tenants.context import system_context, tenant_context
from tenants.testing import Tenant, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)
# Claims racing across connections are PostgreSQL's (SELECT … FOR UPDATE SKIP LOCKED); the
# embedded SQLite has one writer at a time and one worker pool.
postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row locks across connections need PostgreSQL"
)


@pytest.fixture(autouse=True)
def _fast(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.PROOF_NOTIFY_TIMEOUT_S = 1.0
    settings.PROOF_PUBLIC_URL = "https://proof.example"
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    # The schedule's shape, in hundredths of a second: a test retries at once.
    monkeypatch.setattr(delivery, "RETRY_SCHEDULE_S", (0.0, 0.0, 0.0))


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as s:
        yield s


def _channel(tenant: Tenant, kind: str, target: str = "", **fields: Any) -> Any:
    return services.do_create_channel(
        tenant.principal(tenant.operator_admin),
        name=f"{kind} channel",
        kind=kind,
        target=target,
        **fields,
    )


def _merge(tenant: Tenant, verdicts: list[dict[str, Any]], end: float, job: int) -> None:
    with tenant_context(tenant.operator.pk):
        inv.merge_verdicts(tenant.operator.pk, verdicts, window_end=end, job_pk=job)


def _rows(**filters: Any) -> list[OutboxDelivery]:
    with system_context():
        return list(OutboxDelivery.objects.filter(**filters).order_by("id"))


def _incident(tenant: Tenant) -> Incident:
    with tenant_context(tenant.operator.pk):
        incident = Incident.objects.for_tenant(tenant.operator.pk).order_by("-id").first()
    assert incident is not None
    return incident


def _job(tenant: Tenant, job: str = "job-1") -> int:
    return store_gpu_job(tenant.operator.pk, job, f"agent-{tenant.operator.slug}-{job}")


def _hours_verdict(hours: float | None = 2.5, **kw: Any) -> dict[str, Any]:
    v = verdict(**kw)
    v["impact"] = {"slowdown_pct": 30.0, "gpu_hours_lost": hours}
    return v


def test_webhook_signed_per_standard_webhooks_with_every_active_secret(stack: ExitStack) -> None:
    a = make_tenant("nw-a")
    hook = stack.enter_context(running(Receiver()))
    made = _channel(a, "webhook", hook.url)
    assert made.secret.startswith("whsec_") and len(formats.secret_bytes(made.secret)) >= 24
    _merge(a, [_hours_verdict()], 1_100, _job(a))
    assert delivery.deliver_due() == 1
    [request] = hook.wait_for(1)
    body = verify(made.secret, request)
    incident = _incident(a)
    assert body == incident.verdict  # the body is the verdict JSON
    assert request.headers["webhook-id"] == _rows()[0].event_id
    # A forged or tampered body fails verification.
    with pytest.raises(InvalidSignature):
        verify(services.new_secret(), request)
    # Rotation: the new secret and the old one both sign the next event.
    new = services.do_rotate_secret(a.principal(a.operator_admin), made.channel)
    _merge(a, [_hours_verdict(category="infrastructure", end=1_200)], 1_200, _job(a))
    delivery.deliver_due()
    second = hook.wait_for(2)[1]
    assert len(second.headers["webhook-signature"].split(" ")) == 2
    assert verify(new, second)["category"] == "infrastructure"
    assert verify(made.secret, second)["category"] == "infrastructure"
    assert [r.state for r in _rows()] == [DeliveryState.SENT, DeliveryState.SENT]


def test_slack_block_kit_within_limits_with_a_button_to_the_verdict(stack: ExitStack) -> None:
    a = make_tenant("ns-a")
    slack = stack.enter_context(running(Receiver()))
    _channel(a, "slack", slack.url)
    huge = _hours_verdict(title="T" * 400)
    huge["summary"] = "<&> " * 3_000  # 12,000 characters, markup to escape
    huge["evidence"] = [dict(huge["evidence"][0], id=f"e{i}", note="n" * 900) for i in range(80)]
    _merge(a, [huge], 1_100, _job(a))
    delivery.deliver_due()
    message = slack.wait_for(1)[0].json()
    blocks = message["blocks"]
    assert len(blocks) <= 50
    assert blocks[0]["type"] == "header" and len(blocks[0]["text"]["text"]) <= 150
    for block in blocks:
        if block["type"] == "section" and "text" in block:
            text = block["text"]["text"]
            assert len(text) <= 3000
            # Truncated after escaping: no raw markup, no entity cut into a bare '&'.
            assert "<" not in text and ">" not in text
        for f in block.get("fields", []):
            assert len(f["text"]) <= 2000
    fields = " ".join(f["text"] for f in blocks[1]["fields"])
    assert "job job-1" in fields and "2.50 GPU-hours lost" in fields and "*Category*" in fields
    evidence = next(b for b in blocks if "Top evidence" in b.get("text", {}).get("text", ""))
    assert evidence["text"]["text"].count("•") == formats.TOP_EVIDENCE
    [button] = blocks[-1]["elements"]
    assert button["url"] == f"https://proof.example/incidents/{_incident(a).public_id}/"


def test_teams_adaptive_card_envelope(stack: ExitStack) -> None:
    a = make_tenant("nt-a")
    teams = stack.enter_context(running(Receiver()))
    _channel(a, "teams", teams.url)
    _merge(a, [_hours_verdict()], 1_100, _job(a))
    delivery.deliver_due()
    message = teams.wait_for(1)[0].json()
    assert message["type"] == "message"
    [attachment] = message["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard" and card["version"] == "1.4"
    facts = {f["title"]: f["value"] for f in card["body"][1]["facts"]}
    assert facts["Category"] == "job" and facts["Subject"] == "job job-1"
    assert card["actions"][0]["url"].endswith(f"/incidents/{_incident(a).public_id}/")


def test_pagerduty_triggers_with_the_incident_as_dedup_key_and_resolves_it(
    stack: ExitStack, settings: Any
) -> None:
    a = make_tenant("np-a")
    pd = stack.enter_context(running(Receiver(statuses=[202])))
    settings.PROOF_PAGERDUTY_EVENTS_URL = pd.url
    _channel(a, "pagerduty", "R0UT1NGKEY0123456789abcdefabcdef")
    other_chat = stack.enter_context(running(Receiver()))
    _channel(a, "slack", other_chat.url)
    job = _job(a)
    _merge(a, [_hours_verdict(family="hardware_fault", category="infrastructure")], 1_100, job)
    delivery.deliver_due()
    trigger = pd.wait_for(1)[0].json()
    incident = _incident(a)
    assert trigger["event_action"] == "trigger"
    assert trigger["dedup_key"] == str(incident.public_id)
    assert trigger["routing_key"] == "R0UT1NGKEY0123456789abcdefabcdef"
    assert trigger["payload"]["severity"] == "critical"
    assert trigger["payload"]["summary"] and trigger["payload"]["source"] == "job-1"
    assert trigger["payload"]["custom_details"]["category"] == "infrastructure"
    # The finding is absent for the grace period: the incident resolves, PagerDuty resolves.
    _merge(a, [], 1_100 + inv.GRACE_S, job)
    assert _incident(a).state == "resolved"
    delivery.deliver_due()
    resolve = pd.wait_for(2)[1].json()
    assert resolve == {
        "routing_key": "R0UT1NGKEY0123456789abcdefabcdef",
        "event_action": "resolve",
        "dedup_key": str(incident.public_id),
    }
    # Chat heard the verdict, not the resolve.
    time.sleep(0.1)
    assert len(other_chat.received) == 1


def test_email_through_django_mail() -> None:
    a = make_tenant("ne-a")
    _channel(a, "email", addresses=["oncall@ne-a.example", "gpu@ne-a.example"])
    _merge(a, [_hours_verdict()], 1_100, _job(a))
    delivery.deliver_due()
    [message] = mail.outbox
    assert message.to == ["oncall@ne-a.example", "gpu@ne-a.example"]
    assert message.subject.startswith("[Proof] ")
    assert f"/incidents/{_incident(a).public_id}/" in message.body
    assert _rows()[0].state == DeliveryState.SENT


def test_email_through_a_real_smtp_server(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    a = make_tenant("nm-a")
    _channel(a, "email", addresses=["oncall@nm-a.example"])
    with smtp_server() as (port, received):
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
        _merge(a, [_hours_verdict()], 1_100, _job(a))
        delivery.deliver_due()
    [message] = received
    assert message.recipients == ["oncall@nm-a.example"]
    text = message.data.decode()
    assert "Subject: [Proof] " in text and f"/incidents/{_incident(a).public_id}/" in text
    assert _rows()[0].state == DeliveryState.SENT


def test_email_to_no_smtp_server_is_retried(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", 9  # nothing listens (discard)
    a = make_tenant("nm2-a")
    _channel(a, "email", addresses=["oncall@nm2-a.example"])
    _merge(a, [_hours_verdict()], 1_100, _job(a))
    delivery.deliver_due()
    [row] = _rows()
    assert row.state == DeliveryState.FAILED and row.last_error.startswith("SMTP")


def test_retry_on_500_then_success_and_give_up_on_other_4xx(stack: ExitStack) -> None:
    a = make_tenant("nr-a")
    flaky = stack.enter_context(running(Receiver(statuses=[500, 429, 200])))
    refusing = stack.enter_context(running(Receiver(statuses=[400])))
    _channel(a, "slack", flaky.url)
    _channel(a, "teams", refusing.url)
    _merge(a, [_hours_verdict()], 1_100, _job(a))
    delivery.deliver_due()
    by_kind = {r.channel.kind: r for r in _rows_with_channel()}
    assert (by_kind["slack"].state, by_kind["slack"].last_status) == ("failed", 500)
    assert (by_kind["teams"].state, by_kind["teams"].last_status) == ("gave_up", 400)
    delivery.deliver_due()
    delivery.deliver_due()
    by_kind = {r.channel.kind: r for r in _rows_with_channel()}
    assert (by_kind["slack"].state, by_kind["slack"].attempts) == ("sent", 3)
    assert by_kind["teams"].attempts == 1 and len(refusing.received) == 1
    # Every attempt carried the same message.
    assert len({r.body for r in flaky.received}) == 1


def test_retry_schedule_is_standard_webhooks_and_runs_out(
    stack: ExitStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.undo()
    assert delivery.RETRY_SCHEDULE_S == (5, 300, 1800, 7200, 18000, 36000, 36000)
    monkeypatch.setattr(delivery, "RETRY_SCHEDULE_S", (0.0,))
    a = make_tenant("nx-a")
    down = stack.enter_context(running(Receiver(statuses=[503])))
    _channel(a, "slack", down.url)
    _merge(a, [_hours_verdict()], 1_100, _job(a))
    delivery.deliver_due()
    delivery.deliver_due()
    assert delivery.deliver_due() == 0
    [row] = _rows()
    assert (row.state, row.attempts, row.last_status) == ("gave_up", 2, 503)


def test_real_schedule_waits_five_seconds_after_the_first_failure(stack: ExitStack) -> None:
    a = make_tenant("n5-a")
    down = stack.enter_context(running(Receiver(statuses=[500])))
    _channel(a, "slack", down.url)
    _merge(a, [_hours_verdict()], 1_100, _job(a))
    delivery.RETRY_SCHEDULE_S = (5, 300)  # restored by the autouse fixture's monkeypatch
    before = time.time()
    delivery.deliver_due()
    [row] = _rows()
    assert row.state == "failed"
    assert 4.5 <= row.next_attempt_at.timestamp() - before <= 7
    assert delivery.deliver_due() == 0  # not due yet


def test_410_disables_the_channel(stack: ExitStack) -> None:
    a = make_tenant("ng-a")
    gone = stack.enter_context(running(Receiver(statuses=[410])))
    made = _channel(a, "webhook", gone.url)
    job = _job(a)
    _merge(a, [_hours_verdict()], 1_100, job)
    delivery.deliver_due()
    [row] = _rows()
    assert (row.state, row.last_status) == ("gave_up", 410)
    with system_context():
        channel = NotificationChannel.objects.get(pk=made.channel.pk)
    assert not channel.enabled and "410" in channel.disabled_reason
    # A disabled channel is owed nothing more.
    _merge(a, [_hours_verdict(category="infrastructure", end=1_200)], 1_200, job)
    assert len(_rows()) == 1


def test_a_hanging_receiver_does_not_delay_another_channel(stack: ExitStack) -> None:
    a = make_tenant("nh-a")
    hanging = stack.enter_context(running(Receiver(delay_s=4.0)))
    fast = stack.enter_context(running(Receiver()))
    _channel(a, "slack", hanging.url)  # created first: its row is claimed first
    _channel(a, "teams", fast.url)
    _merge(a, [_hours_verdict()], 1_100, _job(a))
    started = time.monotonic()
    delivery.deliver_due()
    took = time.monotonic() - started
    [request] = fast.wait_for(1)
    assert request.at - started < 0.5  # not behind the hanging one's 1 s timeout
    assert took < 3.0  # the pass waited the timeout (1 s), not the receiver (4 s)
    by_kind = {r.channel.kind: r for r in _rows_with_channel()}
    assert by_kind["teams"].state == "sent"
    assert by_kind["slack"].state == "failed" and "timed out" in by_kind["slack"].last_error


@postgres_only
def test_one_event_is_never_sent_twice(stack: ExitStack) -> None:
    a = make_tenant("n1-a")
    slow = stack.enter_context(running(Receiver(delay_s=0.3)))
    _channel(a, "slack", slow.url)
    _channel(a, "webhook", slow.url)
    job = _job(a)
    for n in range(3):
        _merge(a, [_hours_verdict(job="job-1", family=f"family_{n}")], 1_100, job)
    # The same notification reached again (a retried evaluation): no second row.
    incident = _incident(a)
    with tenant_context(a.operator.pk):
        revision = incident.revisions.order_by("number").first()
        assert revision is not None
        note = _note(incident, revision)
        services.enqueue_for_notification(note)
    assert len(_rows()) == 6
    # Four workers claim at once, again and again: each row is sent exactly once.
    errors = run_together(lambda _: [delivery.deliver_due() for _ in range(3)], threads=4)
    assert not errors
    requests = slow.wait_for(6)
    time.sleep(0.5)
    ids = [(r.headers.get("webhook-id") or r.body) for r in slow.received]
    assert len(ids) == 6 and len(set(ids)) == 6
    assert all(r.state == "sent" and r.attempts == 1 for r in _rows())
    assert len(requests) == 6


def test_rows_are_written_in_the_evaluation_transaction() -> None:
    a = make_tenant("nt2-a")
    _channel(a, "slack", "http://127.0.0.1:9/never")
    job = _job(a)
    with pytest.raises(RuntimeError), tenant_context(a.operator.pk):
        inv.merge_verdicts(a.operator.pk, [_hours_verdict()], window_end=1_100, job_pk=job)
        assert len(OutboxDelivery.objects.for_tenant(a.operator.pk)) == 1  # inside: there
        raise RuntimeError("the evaluation fails after merging")
    assert _rows() == []
    with system_context():
        assert not NotificationLog.objects.filter(operator_id=a.operator.pk).exists()
    # Its retry writes both.
    _merge(a, [_hours_verdict()], 1_100, job)
    assert len(_rows()) == 1


def test_routing_rules_and_other_operators(stack: ExitStack) -> None:
    a, b = make_tenant("nq-a"), make_tenant("nq-b")
    with tenant_context(a.operator.pk):
        GpuListPrice.objects.create(
            operator_id=a.operator.pk, gpu_model="H100", price_per_gpu_hour=Decimal("2.00")
        )
    hits: dict[str, Receiver] = {}
    rules: dict[str, list[dict[str, Any]]] = {
        "all": [],
        "infra-only": [{"categories": ["infrastructure"]}],
        "family": [{"families": ["sequence_imbalance"]}],
        "mine": [{"customer": a.customer.pk}],
        "big-hours": [{"min_gpu_hours_lost": 3.0}],
        "money-5": [{"min_money_lost": "5.00"}],  # 2.5 h × 2.00 = 5.00: matches
        "money-6": [{"min_money_lost": "6.00"}],
        "either": [{"categories": ["infrastructure"]}, {"families": ["sequence_imbalance"]}],
    }
    for name, rule in rules.items():
        hits[name] = stack.enter_context(running(Receiver()))
        services.do_create_channel(
            a.principal(a.operator_admin),
            name=name,
            kind="slack",
            target=hits[name].url,
            rules=rule,
        )
    b_hook = stack.enter_context(running(Receiver()))
    _channel(b, "webhook", b_hook.url)
    # a's job is a's customer's (ingest attributes jobs by the operator's match rules; here
    # the job has none): the customer rule must not match a job of no customer.
    _merge(a, [_hours_verdict(2.5)], 1_100, _job(a))
    delivery.deliver_due()
    time.sleep(0.2)
    got = {name for name, r in hits.items() if r.received}
    assert got == {"all", "family", "money-5", "either"}
    assert b_hook.received == []
    assert _rows(operator_id=b.operator.pk) == []
    money = hits["all"].received[0].json()["blocks"][1]["fields"][3]["text"]
    assert "5.00 USD lost" in money


def test_a_real_verdict_reaches_a_signed_webhook(stack: ExitStack) -> None:
    a = make_tenant("nv-a")
    hook = stack.enter_context(running(Receiver()))
    made = _channel(a, "webhook", hook.url)
    op = a.operator.pk
    sim = store_sim(op, "sequence_imbalance")
    assert inv.evaluate_job(op, job_pk(op, sim.jobs[0])).status == "evaluated"
    delivery.deliver_due()
    requests = hook.wait_for(1)
    bodies = [verify(made.secret, r) for r in requests]
    with tenant_context(op):
        verdicts = {str(i.public_id): i.verdict for i in Incident.objects.for_tenant(op)}
    assert {b["id"] for b in bodies} == set(verdicts)
    assert any(b["family"] == "sequence_imbalance" for b in bodies)
    for body in bodies:
        assert body == verdicts[body["id"]]
        assert body["subject"]["job"] == sim.jobs[0]


def _rows_with_channel() -> list[OutboxDelivery]:
    with system_context():
        return list(OutboxDelivery.objects.select_related("channel").order_by("id"))


def _note(incident: Incident, revision: Any) -> Any:
    from investigations.notifications import Notification

    return Notification(
        operator_id=incident.operator_id,
        incident_id=incident.pk,
        incident_public_id=str(incident.public_id),
        revision=revision.number,
        kind="new",
        family=revision.family,
        category=revision.category,
        previous_family=None,
        previous_category=None,
        job="job-1",
        customer_id=None,
        verdict=revision.verdict,
    )


@postgres_only
def test_claims_skip_rows_another_worker_holds() -> None:
    a = make_tenant("nk-a")
    _channel(a, "slack", "http://127.0.0.1:9/never")
    _merge(a, [_hours_verdict()], 1_100, _job(a))
    held = threading.Event()
    release = threading.Event()

    def hold_lock(_: int) -> None:
        with transaction.atomic(), system_context():
            list(OutboxDelivery.objects.select_for_update())
            held.set()
            release.wait(5)

    thread = threading.Thread(target=lambda: run_together(hold_lock, 1))
    thread.start()
    assert held.wait(5)
    try:
        assert delivery.claim() == []  # locked by the other: skipped, not waited on
    finally:
        release.set()
        thread.join()
    assert len(delivery.claim()) == 1


def test_a_failing_outbox_write_never_fails_the_evaluation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = make_tenant("nf-a")
    _channel(a, "slack", "http://127.0.0.1:9/never")

    def broken(note: Any) -> int:
        with system_context():
            OutboxDelivery.objects.raw("SELECT * FROM no_such_table")[0]  # a failed statement
        return 0

    monkeypatch.setattr(services, "enqueue_for_notification", broken)
    _merge(a, [_hours_verdict()], 1_100, _job(a))
    # The verdict and its claim committed; the outbox write was logged and left out.
    assert _incident(a).state == "open"
    with system_context():
        assert NotificationLog.objects.filter(operator_id=a.operator.pk).count() == 1
    assert _rows() == []


def test_a_429s_retry_after_is_honoured(stack: ExitStack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delivery, "RETRY_SCHEDULE_S", (5, 300, 1800))
    a = make_tenant("nra-a")
    busy = stack.enter_context(running(Receiver(statuses=[429], headers={"Retry-After": "120"})))
    _channel(a, "slack", busy.url)
    _merge(a, [_hours_verdict()], 1_100, _job(a))
    before = time.time()
    delivery.deliver_due()
    [row] = _rows()
    assert (row.state, row.last_status) == ("failed", 429)
    assert 119 <= row.next_attempt_at.timestamp() - before <= 125  # not the schedule's 5 s


def test_internal_destinations_and_redirects_are_refused(stack: ExitStack, settings: Any) -> None:
    a = make_tenant("nss-a")
    inside = stack.enter_context(running(Receiver()))
    elsewhere = stack.enter_context(running(Receiver()))
    redirecting = stack.enter_context(
        running(Receiver(statuses=[307], headers={"Location": elsewhere.url}))
    )
    _channel(a, "webhook", redirecting.url)
    _merge(a, [_hours_verdict()], 1_100, _job(a))
    delivery.deliver_due()
    [row] = _rows()
    assert (row.state, row.last_status) == ("gave_up", 307)  # not followed, not retried
    assert len(redirecting.received) == 1 and elsewhere.received == []
    # As in production: a destination on this host (or any internal address) is refused.
    settings.PROOF_NOTIFY_ALLOW_PRIVATE = False
    assert delivery.destination_refused("http://169.254.169.254/latest/meta-data/")
    assert delivery.destination_refused("http://10.1.2.3/hook")
    assert delivery.destination_refused("file:///etc/passwd")
    _channel(a, "slack", inside.url)
    _merge(a, [_hours_verdict(category="infrastructure", end=1_200)], 1_200, _job(a))
    delivery.deliver_due()
    refused = [r for r in _rows() if r.state == "gave_up" and r.last_status is None]
    assert len(refused) == 2  # the change, to both channels
    assert all("internal address (127.0.0.1)" in r.last_error for r in refused)
    assert inside.received == [] and len(redirecting.received) == 1
