"""Live updates in a real browser: the console served by daphne (HTTP and /ws/live/) in a
thread of the test process, so that the in-memory channel layer the pipeline publishes on is
the server's; chromium opens /fleet/, /jobs/, the job's page and /incidents/ as the operator
(and /incidents/ as a customer), then a verdict is committed through the live pipeline's merge
service and each page must show it within 2 s of the commit, without reload. The job page's
charts extend when a batch of the job is stored through ingest's services, and its state
follows a job record saying it completed.

The figure: each page's time from the commit to the element's insertion (live.js stamps
data-live-at with the browser's clock; same machine, same clock), printed."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from daphne.server import Server
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application
from django.db import connections, transaction
from twisted.internet import reactor

from frontend.live import receivers
from frontend.live.routing import websocket_urlpatterns
from frontend.seeding import Login, SeedResult
from frontend.selectors.job_detail import GPU_SIGNALS
from frontend.tests.browser.conftest import VIEWPORT, chromium
from ingest import services as ingest_services
from ingest.models import Job
from ingest.processing import Limits, decode_batch
from ingest.tests.helpers import gpu_batch
from investigations import services as inv_services
from investigations.models import Incident
from investigations.tests.live_helpers import verdict
from tenants.context import tenant_context

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LATENCY_LIMIT_MS = 2000.0
CHARTED_GPU_NAMES = tuple(sig.name for sig in GPU_SIGNALS if not sig.process)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LiveServer:
    url: str


@pytest.fixture(scope="session")
def daphne_server(django_db_setup: None, django_db_blocker: Any) -> Iterator[LiveServer]:
    """Daphne on a free port, in a daemon thread (Twisted's reactor runs once a process: one
    server for the session). Static files through Django's ASGI static handler, as runserver.
    Torn down before the test database (it depends on django_db_setup): the server's database
    connections are ended before it is dropped."""
    application = ProtocolTypeRouter(
        {
            "http": ASGIStaticFilesHandler(get_asgi_application()),
            "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
        }
    )
    port = _free_port()
    server = Server(
        application=application,
        endpoints=[f"tcp:port={port}:interface=127.0.0.1"],
        signal_handlers=False,
    )
    threading.Thread(target=server.run, name="daphne", daemon=True).start()
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"daphne did not listen on {port} within 20 s")
            time.sleep(0.1)
    yield LiveServer(f"http://127.0.0.1:{port}")
    reactor.callFromThread(server.stop)
    # The server's views and consumers ran in threads of their own (one per request or
    # connection: Django's and Channels' thread-sensitive contexts), which left their database
    # connections open; the test database cannot be dropped while they are.
    if connections["default"].vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
            "current_database() AND pid <> pg_backend_pid() AND usename = current_user"
        )


def _in_thread(work: Callable[[], Any]) -> Any:
    """Run ORM work off the Playwright thread (Django refuses it there), connections closed."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    if errors:
        raise errors[0]
    return result[0] if result else None


def _sign_in(context: Any, base: str, login: Login) -> Any:
    page = context.new_page()
    page.goto(base + "/login/")
    page.fill('input[name="username"]', login.username)
    page.fill('input[name="password"]', login.password)
    page.click('button[type="submit"]')
    page.wait_for_url(base + "/")
    return page


def _open_live(page: Any, base: str, path: str) -> None:
    response = page.goto(base + path)
    assert response is not None and response.status == 200, (path, response and response.status)
    page.wait_for_selector('[data-live-status="live"]', timeout=10_000)


def _commit_new_verdict(
    operator_id: int, job_id: str, job_pk: int, family: str
) -> tuple[str, float]:
    """A new verdict merged by the live pipeline's service; (public id, commit time)."""
    committed: list[float] = []
    now = time.time()
    v = verdict(family, "job", job=job_id, start=now - 120, end=now, title=f"Live {family}")
    with tenant_context(operator_id), transaction.atomic():
        # Registered first, so it runs first of the commit's callbacks: the commit's time.
        transaction.on_commit(lambda: committed.append(time.time()))
        inv_services.merge_verdicts(operator_id, [v], window_end=now, job_pk=job_pk)
    with tenant_context(operator_id):
        incident = Incident.objects.for_tenant(operator_id).get(job_id=job_pk, family=family)
    return str(incident.public_id), committed[0]


def _unused_family(operator_id: int, job_pk: int) -> str:
    with tenant_context(operator_id):
        taken = set(
            Incident.objects.for_tenant(operator_id)
            .filter(job_id=job_pk)
            .values_list("family", flat=True)
        )
    return next(
        f for f in ("sequence_imbalance", "dataloader_stall", "nccl_hang") if f not in taken
    )


def _store(operator_id: int, agent: str, sequence: int, **kwargs: Any) -> None:
    ingest_services.store_batch(
        operator_id, decode_batch(gpu_batch(agent, sequence, **kwargs), Limits())
    )


def _job_state(operator_id: int, job_pk: int) -> str:
    with tenant_context(operator_id):
        return str(Job.objects.for_tenant(operator_id).get(pk=job_pk).state)


def _arrived_ms(page: Any, selector: str) -> float:
    element = page.wait_for_selector(selector, timeout=5_000)
    return float(element.get_attribute("data-live-at"))


def test_a_committed_verdict_appears_on_the_four_pages_within_2_s(
    daphne_server: LiveServer, seeded: SeedResult
) -> None:
    main = seeded.main
    charted = main.charted[0]
    job_id, job_pk, op = charted.job_id, charted.job_pk, main.operator_id
    job_path = f"/jobs/{quote(job_id, safe='/')}/"
    family = _in_thread(lambda: _unused_family(op, job_pk))
    customer_login = seeded.customer_login()
    customer_hears = main.job_customer.get(job_id) == customer_login.customer_id
    base = daphne_server.url
    with chromium() as browser:
        operator = browser.new_context(viewport=VIEWPORT)
        errors: list[str] = []
        pages: dict[str, Any] = {}
        for path in ("/fleet/", "/jobs/", job_path, "/incidents/"):
            page = (
                _sign_in(operator, base, main.logins["operator_admin"])
                if not pages
                else operator.new_page()
            )
            page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
            _open_live(page, base, path)
            pages[path] = page
        assert pages["/jobs/"].locator(f'tr[data-job="{job_id}"]').count() == 1
        customer = browser.new_context(viewport=VIEWPORT)
        customer_page = _sign_in(customer, base, customer_login)
        _open_live(customer_page, base, "/incidents/")

        public_id, committed = _in_thread(lambda: _commit_new_verdict(op, job_id, job_pk, family))
        committed_ms = committed * 1000.0
        selectors = {
            "/fleet/": f'[data-testid="live-verdicts"] li[data-incident="{public_id}"]',
            "/jobs/": f'table.jobs tr[data-job="{job_id}"][data-live-verdict="{public_id}"]',
            job_path: f'table.job-incidents tr[data-incident="{public_id}"]',
            "/incidents/": f'table.incident-list tr[data-incident="{public_id}"]',
        }
        latency = {
            path: _arrived_ms(pages[path], selector) - committed_ms
            for path, selector in selectors.items()
        }
        print("commit → DOM, ms: " + ", ".join(f"{path} {ms:.0f}" for path, ms in latency.items()))
        for path, ms in latency.items():
            assert ms < LATENCY_LIMIT_MS, (path, ms)
        # Each links the verdict's page, and it opens.
        link = pages["/incidents/"].locator(
            f'{selectors["/incidents/"]} a[href="/incidents/{public_id}/"]'
        )
        assert link.count() == 1
        assert f"Live {family}" in link.inner_text()
        # The customer hears it only if the job is its own.
        row = f'table.incident-list tr[data-incident="{public_id}"]'
        if customer_hears:
            customer_page.wait_for_selector(row, timeout=5_000)
        else:
            customer_page.wait_for_timeout(500)
            assert customer_page.locator(row).count() == 0

        # The job page's charts extend with a stored batch of the job; its state follows.
        job_page = pages[job_path]
        drawn = job_page.locator("[data-chart^='job-gpu-']")
        assert drawn.count() > 0, "the charted job's page has no GPU chart"
        chart_id = drawn.first.get_attribute("data-chart")
        receivers.POINTS.clear()
        now = time.time()
        was = _in_thread(lambda: _job_state(op, job_pk))
        state = "failed" if was == "completed" else "completed"
        finished = [{"type": "job", "ts": now, "job": job_id, "state": state}]
        _in_thread(
            lambda: _store(
                op,
                "live-browser",
                1,
                node=charted.nodes[0],
                job=job_id,
                gpus=2,
                seconds=3,
                start=now - 3,
                names=CHARTED_GPU_NAMES,
                extra_records=finished,
            )
        )
        job_page.wait_for_selector(
            f'[data-chart="{chart_id}"][data-live-points="1"]', timeout=5_000
        )
        job_page.wait_for_function(
            "s => document.querySelector('[data-live=\"job-state\"]').textContent === s",
            arg=state,
            timeout=5_000,
        )
        assert not errors, errors
