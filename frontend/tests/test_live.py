"""`/ws/live/` through the real websocket stack (session auth, the console's routes) with
channels' WebsocketCommunicator; verdicts come from investigations' real merge service, job
states and chart points from batches stored through ingest's services. Who hears what:
an operator its fleet, a customer its own jobs only, another operator nothing; narrowing to a
job or incident the principal may not see is refused and hears nothing of it."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client

from contract import signals
from frontend.live import receivers
from frontend.live.points import PointsThrottle, newest_points
from frontend.live.routing import websocket_urlpatterns
from ingest import selectors as ingest_selectors
from ingest import services as ingest_services
from ingest.models import Job
from ingest.processing import Limits, decode_batch
from ingest.tests.helpers import gpu_batch
from investigations import services
from investigations.models import Incident
from investigations.tests.live_helpers import job_pk, store_gpu_job, verdict
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.models import MatchField, Role
from tenants.testing import TEST_PASSWORD, Tenant, make_tenant

pytestmark = pytest.mark.django_db(transaction=True)

# The websocket stack of proof_web/asgi.py below its origin check (ALLOWED_HOSTS is "*" under
# tests): session auth and the console's routes.
application = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
QUIET_S = 0.3  # how long "hears nothing" listens, once a listener that should hear has heard


@dataclass
class World:
    a: Tenant
    b: Tenant
    other_viewer: User  # a customer of a's operator, not a.customer


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    ingest_selectors.clear_cache()
    receivers.POINTS.clear()  # a fresh throttle per test
    # A channel layer of its own per test: channels_redis keeps its receive lock on the layer
    # and binds it to the event loop of the first receiver, and each test runs its consumers
    # on a loop of its own (async_to_sync). A receiver left from an earlier test (a browser
    # test's server, a communicator not yet gone) kept the old lock, and five tests of this
    # module then failed in CI's full run with "Lock ... is bound to a different event loop".
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture
def world() -> World:
    a, b = make_tenant("live-a"), make_tenant("live-b")
    admin = a.principal(a.operator_admin)
    other = tenant_services.do_create_customer(admin, name="Other", slug="other")
    other_viewer = tenant_services.do_create_member(
        operator_id=a.operator.pk,
        username="live-other-viewer",
        email="",
        password=TEST_PASSWORD,
        role=Role.CUSTOMER_VIEWER,
        customer_id=other.pk,
    ).user
    for prefix, customer in (("acme-", a.customer.pk), ("other-", other.pk)):
        tenant_services.do_create_mapping_rule(
            admin, match_field=MatchField.JOB_ID_PREFIX, value=prefix, customer_id=customer
        )
    store_gpu_job(a.operator.pk, "acme-1", "a1")
    store_gpu_job(a.operator.pk, "acme-2", "a2")
    store_gpu_job(a.operator.pk, "other-1", "a3")
    store_gpu_job(b.operator.pk, "acme-1", "b1")
    return World(a=a, b=b, other_viewer=other_viewer)


def _cookie(user: User | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if user is not None:
        client = Client()
        client.force_login(user)
        session = client.cookies[settings.SESSION_COOKIE_NAME].value
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={session}".encode()))
    return headers


async def _connect(user: User | None) -> WebsocketCommunicator:
    headers = await database_sync_to_async(_cookie)(user)
    communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def _hello(user: User) -> WebsocketCommunicator:
    communicator = await _connect(user)
    hello = await communicator.receive_json_from(timeout=5)
    assert hello["type"] == "hello", hello
    return communicator


def _commit_verdict(tenant: Tenant, v: dict[str, Any], job: str | None = None) -> str:
    """Merge one verdict through the live pipeline's service, committed; its public id."""
    op = tenant.operator.pk
    scope: dict[str, Any] = {"job_pk": job_pk(op, job)} if job else {"gpu": v["subject"]["gpu"]}
    with tenant_context(op):
        services.merge_verdicts(op, [v], window_end=1_100, **scope)
        incident = Incident.objects.for_tenant(op).order_by("-id").first()
    assert incident is not None
    return str(incident.public_id)


commit_verdict = database_sync_to_async(_commit_verdict)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async_to_sync(scenario)()


def test_operator_hears_its_fleet_with_the_message_shape(world: World) -> None:
    async def scenario() -> None:
        ws = await _hello(world.a.operator_admin)
        public_id = await commit_verdict(world.a, verdict(job="acme-1", title="Slow"), "acme-1")
        message = await ws.receive_json_from(timeout=5)
        assert message == {
            "type": "verdict",
            "incident": public_id,
            "job": "acme-1",
            "family": "sequence_imbalance",
            "category": "job",
            "title": "Slow",
            "revision": 1,
            "kind": "new",
            "url": f"/incidents/{public_id}/",
        }
        # A fleet-health verdict (no job) and another customer's job: the operator hears both.
        gpu_v = verdict("gpu_degrading", "infrastructure", job=None, gpu="GPU-a-7")
        await commit_verdict(world.a, gpu_v)
        assert (await ws.receive_json_from(timeout=5))["family"] == "gpu_degrading"
        await commit_verdict(world.a, verdict(job="other-1"), "other-1")
        assert (await ws.receive_json_from(timeout=5))["job"] == "other-1"
        await ws.disconnect()

    run(scenario)


def test_customer_hears_its_own_jobs_only(world: World) -> None:
    async def scenario() -> None:
        operator = await _hello(world.a.operator_admin)
        mine = await _hello(world.a.customer_viewer)
        other = await _hello(world.other_viewer)
        await commit_verdict(world.a, verdict(job="other-1"), "other-1")
        assert (await operator.receive_json_from(timeout=5))["job"] == "other-1"
        assert (await other.receive_json_from(timeout=5))["job"] == "other-1"
        assert await mine.receive_nothing(QUIET_S)
        await commit_verdict(
            world.a, verdict("gpu_degrading", "infrastructure", job=None, gpu="GPU-a-7")
        )
        assert (await operator.receive_json_from(timeout=5))["family"] == "gpu_degrading"
        assert await mine.receive_nothing(QUIET_S)  # the fleet's verdicts are the operator's
        await commit_verdict(world.a, verdict(job="acme-2"), "acme-2")
        assert (await mine.receive_json_from(timeout=5))["job"] == "acme-2"
        assert await other.receive_nothing(QUIET_S)
        for ws in (operator, mine, other):
            await ws.disconnect()

    run(scenario)


def test_another_operator_hears_nothing(world: World) -> None:
    async def scenario() -> None:
        a_ops = await _hello(world.a.operator_admin)
        b_ops = await _hello(world.b.operator_admin)
        b_customer = await _hello(world.b.customer_viewer)  # b's customer has a job "acme-1" too
        await commit_verdict(world.a, verdict(job="acme-1"), "acme-1")
        assert (await a_ops.receive_json_from(timeout=5))["job"] == "acme-1"
        assert await b_ops.receive_nothing(QUIET_S)
        assert await b_customer.receive_nothing(QUIET_S)
        for ws in (a_ops, b_ops, b_customer):
            await ws.disconnect()

    run(scenario)


def test_anonymous_and_member_less_users_are_closed(world: World) -> None:
    async def scenario() -> None:
        anonymous = await _connect(None)
        closed = await anonymous.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4401}
        nobody = await database_sync_to_async(User.objects.create_user)(
            "live-nobody", password=TEST_PASSWORD
        )
        member_less = await _connect(nobody)
        closed = await member_less.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4403}

    run(scenario)


def test_narrowing_to_a_job_or_incident_the_principal_may_not_see_is_refused(
    world: World,
) -> None:
    async def scenario() -> None:
        theirs = await commit_verdict(world.a, verdict(job="other-1"), "other-1")
        b_incident = await commit_verdict(world.b, verdict(job="acme-1"), "acme-1")
        customer = await _hello(world.a.customer_viewer)
        operator = await _hello(world.a.operator_admin)
        await customer.send_json_to({"subscribe": {"job": "other-1"}})
        refused = await customer.receive_json_from(timeout=5)
        assert refused["type"] == "error" and refused["job"] == "other-1"
        assert "other-1" in refused["error"]
        await customer.send_json_to({"subscribe": {"incident": theirs}})
        refused = await customer.receive_json_from(timeout=5)
        assert refused == {
            "type": "error",
            "error": f"no incident {theirs} you may see",
            "incident": theirs,
        }
        # The operator may not narrow to another operator's incident either.
        await operator.send_json_to({"subscribe": {"incident": b_incident}})
        assert (await operator.receive_json_from(timeout=5))["type"] == "error"
        # The other customer's job's next verdict: the customer hears nothing of it.
        await commit_verdict(world.a, verdict("checkpoint_stall", "job", job="other-1"), "other-1")
        assert (await operator.receive_json_from(timeout=5))["family"] == "checkpoint_stall"
        assert await customer.receive_nothing(QUIET_S)
        # Bad input names what is wrong.
        await customer.send_json_to({"subscribe": {"incident": "nope"}})
        bad = await customer.receive_json_from(timeout=5)
        assert bad["type"] == "error" and "subscribe.incident" in bad["error"]
        await customer.send_json_to({"listen": 1})
        assert "subscribe" in (await customer.receive_json_from(timeout=5))["error"]
        await customer.send_json_to({"subscribe": {"node": "x"}})
        assert "'node'" in (await customer.receive_json_from(timeout=5))["error"]
        for ws in (customer, operator):
            await ws.disconnect()

    run(scenario)


def test_narrowing_to_an_own_job_hears_only_that_job(world: World) -> None:
    async def scenario() -> None:
        ws = await _hello(world.a.customer_viewer)
        await ws.send_json_to({"subscribe": {"job": "acme-1"}})
        assert await ws.receive_json_from(timeout=5) == {"type": "subscribed", "job": "acme-1"}
        await commit_verdict(world.a, verdict(job="acme-2"), "acme-2")
        await commit_verdict(world.a, verdict(job="acme-1"), "acme-1")
        heard = await ws.receive_json_from(timeout=5)
        assert heard["job"] == "acme-1"  # acme-2's verdict, committed first, was not heard
        assert await ws.receive_nothing(QUIET_S)
        # Narrowing to an incident: its revisions (a category change notifies again).
        public_id = heard["incident"]
        await ws.send_json_to({"subscribe": {"incident": public_id}})
        assert (await ws.receive_json_from(timeout=5))["type"] == "subscribed"
        await commit_verdict(world.a, verdict(job="acme-1", category="infrastructure"), "acme-1")
        changed = await ws.receive_json_from(timeout=5)
        assert (changed["incident"], changed["kind"], changed["category"]) == (
            public_id,
            "changed",
            "infrastructure",
        )
        await ws.disconnect()

    run(scenario)


def _store(tenant: Tenant, job: str, agent: str, sequence: int, **kwargs: Any) -> None:
    batch = decode_batch(gpu_batch(agent, sequence, job=job, **kwargs), Limits())
    ingest_services.store_batch(tenant.operator.pk, batch)


store = database_sync_to_async(_store)


def test_job_state_changes_reach_operator_and_the_jobs_customer(world: World) -> None:
    async def scenario() -> None:
        operator = await _hello(world.a.operator_admin)
        mine = await _hello(world.a.customer_viewer)
        other = await _hello(world.other_viewer)
        b_ops = await _hello(world.b.operator_admin)
        now = time.time()
        ended = [{"type": "job", "ts": now, "job": "acme-1", "state": "completed"}]
        await store(world.a, "acme-1", "a1", 2, extra_records=ended)
        expected = {"type": "job", "job": "acme-1", "state": "completed"}
        assert await operator.receive_json_from(timeout=5) == expected
        assert await mine.receive_json_from(timeout=5) == expected
        assert await other.receive_nothing(QUIET_S)
        assert await b_ops.receive_nothing(QUIET_S)
        # The same state again is no change: nothing is sent.
        await store(world.a, "acme-1", "a1", 3, extra_records=ended)
        assert await operator.receive_nothing(QUIET_S)
        for ws in (operator, mine, other, b_ops):
            await ws.disconnect()

    run(scenario)


def test_a_job_ending_by_its_ranks_exiting_is_announced(world: World) -> None:
    """No job record says the end of a torchrun job: the last rank's exit does (ingest's
    _end_job_when_every_rank_exited), and that change is announced too."""
    now = time.time()
    ranks = [
        {
            "type": "process",
            "ts": now - 9,
            "node": "node-a",
            "pid": 700 + rank,
            "job": "acme-9",
            "rank": rank,
            "local_rank": rank,
            "world_size": 2,
            "cmd": ["python", "-m", "train"],
        }
        for rank in range(2)
    ]

    def exit_of(pid: int, code: int) -> list[dict[str, Any]]:
        return [{"type": "exit", "ts": now - 2, "node": "node-a", "pid": pid, "exit_code": code}]

    async def scenario() -> None:
        await store(world.a, "acme-9", "a9", 1, extra_records=ranks)
        mine = await _hello(world.a.customer_viewer)
        await store(world.a, "acme-9", "a9", 2, extra_records=exit_of(700, 0))
        assert await mine.receive_nothing(QUIET_S)  # rank 1 still runs
        await store(world.a, "acme-9", "a9", 3, extra_records=exit_of(701, 3))
        assert await mine.receive_json_from(timeout=5) == {
            "type": "job",
            "job": "acme-9",
            "state": "failed",
        }
        await mine.disconnect()

    run(scenario)


def test_chart_points_reach_the_open_job_page_at_most_every_2_s(world: World) -> None:
    names = (signals.DCGM_FI_PROF_SM_ACTIVE, signals.DCGM_FI_DEV_POWER_USAGE)

    receivers.POINTS.clear()  # the world's batches of acme-1 were sent (to nobody) just now

    async def scenario() -> None:
        page = await _hello(world.a.customer_viewer)
        await page.send_json_to({"subscribe": {"job": "acme-1"}})
        assert (await page.receive_json_from(timeout=5))["type"] == "subscribed"
        fleet = await _hello(world.a.operator_admin)  # not narrowed: no points
        start = time.time() - 10
        await store(world.a, "acme-1", "a1", 5, names=names, start=start, seconds=10)
        points = await page.receive_json_from(timeout=5)
        # gpu_batch's values: gpu_index * 1000 + name index * 100 + second; SM activity in %.
        assert points["type"] == "points" and points["job"] == "acme-1"
        assert points["t"] == pytest.approx(start + 9, abs=0.01)
        assert points["charts"] == {
            "job-gpu-sm": {"rank 0": 900.0, "rank 1": 100_900.0},
            "job-gpu-power": {"rank 0": 109.0, "rank 1": 1109.0},
        }
        assert await fleet.receive_nothing(QUIET_S)
        # A second batch within 2 s is held back (merged into the next message).
        await store(world.a, "acme-1", "a1", 6, names=names, start=start + 10, seconds=2)
        assert await page.receive_nothing(QUIET_S)
        for ws in (page, fleet):
            await ws.disconnect()

    run(scenario)


def test_points_of_a_batch_and_the_throttle() -> None:
    start = float(int(time.time()) - 5)
    decoded = decode_batch(
        gpu_batch(job="j", gpus=3, seconds=5, start=start, names=(signals.DCGM_FI_DEV_SM_CLOCK,)),
        Limits(),
    )
    assert newest_points(decoded) == {
        "j": (start + 4, {"job-gpu-clock": {"rank 0": 4.0, "rank 1": 1004.0, "rank 2": 2004.0}})
    }
    # Samples without a job are no job's points.
    assert newest_points(decode_batch(gpu_batch(job=None), Limits())) == {}
    throttle = PointsThrottle(interval_s=2.0)
    first = throttle.offer(1, "j", 10.0, {"c": {"rank 0": 1.0}}, now=100.0)
    assert first == {"type": "points", "job": "j", "t": 10.0, "charts": {"c": {"rank 0": 1.0}}}
    assert throttle.offer(1, "j", 11.0, {"c": {"rank 1": 2.0}}, now=101.0) is None
    assert throttle.offer(2, "j", 11.0, {"c": {"rank 0": 5.0}}, now=101.0) is not None  # per op
    merged = throttle.offer(1, "j", 12.0, {"c": {"rank 0": 3.0}}, now=102.5)
    assert merged == {
        "type": "points",
        "job": "j",
        "t": 12.0,
        "charts": {"c": {"rank 0": 3.0, "rank 1": 2.0}},
    }


def test_an_unreachable_channel_layer_never_fails_the_pipeline(
    world: World, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]},
        }
    }
    with caplog.at_level(logging.ERROR, logger="frontend.live.publish"):
        started = time.monotonic()
        public_id = _commit_verdict(world.a, verdict(job="acme-1"), "acme-1")
        ended = [{"type": "job", "ts": time.time(), "job": "acme-1", "state": "failed"}]
        _store(world.a, "acme-1", "a1", 9, extra_records=ended)
        # Neither waited on the layer (a connect to a closed port fails fast; a send that
        # hangs would not hold them either: it runs on the publisher's loop).
        assert time.monotonic() - started < 5
        with tenant_context(world.a.operator.pk):
            assert Incident.objects.filter(public_id=public_id).exists()
            assert _job_state(world.a, "acme-1") == "failed"
        # The sends fail on the publisher's loop, after the pipeline went on: logged there.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(_failures(caplog)) < 2:
            time.sleep(0.05)
    assert {"verdict", "job"} <= _failures(caplog), caplog.text


def _failures(caplog: pytest.LogCaptureFixture) -> set[str]:
    """The kinds of live update logged as not sent."""
    return {
        r.getMessage().split()[2]
        for r in caplog.records
        if r.getMessage().startswith("live update ") and " not sent" in r.getMessage()
    }


def _job_state(tenant: Tenant, job: str) -> str:
    return str(Job.objects.for_tenant(tenant.operator.pk).get(job_id=job).state)


def test_the_redis_channel_layer_carries_live_updates(world: World, settings: Any) -> None:
    """Production's layer: the publisher's async_to_sync send through Redis."""
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [settings.REDIS_URL], "prefix": f"test-live-{time.time_ns()}"},
        }
    }

    async def scenario() -> None:
        ws = await _hello(world.a.operator_admin)
        await commit_verdict(world.a, verdict(job="acme-1"), "acme-1")
        assert (await ws.receive_json_from(timeout=5))["job"] == "acme-1"
        await ws.disconnect()

    run(scenario)
