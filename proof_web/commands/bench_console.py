"""`proof bench console`: server time and queries of every console page on a 10,000-GPU fleet.

Seeds (frontend/seeding/) the main operator `--slug` — 1,250 nodes × 8 GPUs, 2,000 jobs,
20,000 incidents, a simulated day of every signal for the charted jobs — and a second
operator, into the database the settings name (DATABASE_URL's PostgreSQL, else the embedded
SQLite; either migrated first — PostgreSQL as its owner, DATABASE_OWNER_URL). A seed already there is reused unless
`--reseed` (which deletes it and seeds again): seeding takes minutes, a bench pass seconds.

Then requests every page through Django's test client, in this process: the whole middleware
stack (sessions, the tenant context and row-level security setting), the view, its selectors
and the template, signed in as the operator admin and as a customer viewer (the operator-only
pages must answer that one 404). Each page once to warm up, once with its SQL captured (the
query count), then `--repeat` times timed. Printed per page and user: status, queries, p50 and
p95 server time (ms), against the target (`--target-ms`, 150). List pages are also requested
with the sort, filter and page links their own HTML offers (up to `--links` of them), so the
bench follows whatever parameters the pages define.

It needs no running server, worker or agent. CI does not run it (tests/… run the seeder on a
tiny seed instead).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from html import unescape
from typing import Any
from urllib.parse import quote, urlsplit

from contract.cli import NumberOption, add_number_options
from proof_web import heap

_NUMBER_OPTIONS: tuple[NumberOption, ...] = (
    ("--repeat", int, 20, "timed requests per page (default 20)"),
    ("--links", int, 4, "sort/filter/page links followed per list page (default 4)"),
    ("--target-ms", float, 150.0, "p95 target per page, ms (default 150)"),
    ("--nodes", int, 1250, "nodes of 8 GPUs (default 1,250: 10,000 GPUs)"),
    ("--jobs", int, 2000, "jobs (default 2,000)"),
    ("--incidents", int, 20000, "incidents (default 20,000)"),
    ("--customers", int, 24, "customers (default 24)"),
    ("--charted-jobs", int, 4, "jobs with a simulated day of every signal (default 4)"),
    ("--series-hours", float, 24.0, "hours of series of each charted job (default 24)"),
)
LIST_PAGES = ("jobs", "incidents", "price", "fleet", "health")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_number_options(parser, _NUMBER_OPTIONS)
    parser.add_argument("--slug", default="bench-console", help="the seeded operator's slug")
    parser.add_argument("--reseed", action="store_true", help="delete the seed and seed again")
    parser.add_argument("--tiny", action="store_true", help="a tiny seed (a smoke run)")
    parser.add_argument("--json", default="", help="also write the results to this file")


@dataclass
class Page:
    name: str  # the page's area and what is asked of it
    url: str
    user: str  # login key: operator_admin, customer_viewer
    expect: int = 200


@dataclass
class Measured:
    name: str
    url: str
    user: str
    status: int
    expect: int
    queries: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    # This process's CPU (Python: view, template, ORM; the database's is not in it), and the
    # time waiting on the database in the counted request.
    cpu_p50_ms: float
    sql_ms: float
    times_ms: list[float] = field(default_factory=list)


def _p(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _job_url(job_id: str) -> str:
    return f"/jobs/{quote(job_id, safe='/')}/"


_HREF = re.compile(r'href="([^"]+)"')


def _links(html: str, path: str, limit: int) -> list[str]:
    """The links of a list page to itself with a query string (sort headers, filters, pages)."""
    out: list[str] = []
    for raw in _HREF.findall(html):
        href = unescape(raw)
        parts = urlsplit(href)
        if parts.path in ("", path) and parts.query and not parts.netloc:
            url = f"{path}?{parts.query}"
            if url not in out:
                out.append(url)
    # Spread the picks over the page (sort headers come first, pagination last).
    if len(out) <= limit:
        return out
    step = len(out) / limit
    return [out[int(i * step)] for i in range(limit)]


def _settings_links(html: str) -> list[str]:
    out: list[str] = []
    for raw in _HREF.findall(html):
        href = unescape(raw)
        if href.startswith("/settings/") and "?" not in href and href not in out:
            out.append(href)
    return out


def _targets(slug: str) -> dict[str, Any]:
    """What the pages are asked about, read from the seed: the charted job (most series), a
    large synthetic job, an incident of the charted job and one elsewhere, the customer's."""
    from django.db.models import Count

    from ingest.models import Job, Series
    from investigations.models import Incident
    from tenants.context import system_context, tenant_context
    from tenants.models import Membership, Operator, Role

    with system_context():
        operator = Operator.objects.get(slug=slug)
        viewer = (
            Membership.objects.filter(operator=operator, role=Role.CUSTOMER_VIEWER)
            .select_related("user")
            .order_by("id")
            .first()
        )
        admin = (
            Membership.objects.filter(operator=operator, role=Role.OPERATOR_ADMIN)
            .select_related("user")
            .first()
        )
    if viewer is None or admin is None or viewer.customer_id is None:
        raise RuntimeError(f"operator {slug!r} has no customer viewer or admin: --reseed")
    customer_id: int = viewer.customer_id
    op = operator.pk
    with tenant_context(op):
        charted = (
            Series.objects.for_tenant(op)
            .filter(job__isnull=False)
            .values("job_id")
            .annotate(n=Count("id"))
            .order_by("-n")
            .first()
        )
        jobs = Job.objects.for_tenant(op)
        charted_job = jobs.get(pk=charted["job_id"]) if charted else jobs.first()
        big_job = jobs.order_by("-world_size", "id").first()
        incidents = Incident.objects.for_tenant(op)
        charted_incident = incidents.filter(job=charted_job).order_by("-last_seen").first()
        other_incident = incidents.exclude(job=charted_job).order_by("-last_seen").first()
        mine = jobs.filter(customer_id=customer_id)
        own_job = (
            charted_job
            if charted_job is not None and charted_job.customer_id == customer_id
            else mine.order_by("-world_size").first()
        )
        own_incident = incidents.filter(job__customer_id=customer_id).first()
        foreign_job = jobs.exclude(customer_id=customer_id).exclude(customer=None).first()
    return {
        "users": {"operator_admin": admin.user, "customer_viewer": viewer.user},
        "charted_job": charted_job,
        "big_job": big_job,
        "charted_incident": charted_incident or other_incident,
        "other_incident": other_incident,
        "own_job": own_job,
        "own_incident": own_incident,
        "foreign_job": foreign_job,
    }


def _pages(t: dict[str, Any]) -> list[Page]:
    op, cu = "operator_admin", "customer_viewer"
    pages = [
        Page("fleet", "/fleet/", op),
        Page("health", "/health/", op),
        Page("price", "/price/", op),
        Page("jobs", "/jobs/", op),
        Page("incidents", "/incidents/", op),
        Page("settings", "/settings/", op),
    ]
    if t["charted_job"] is not None:
        pages.append(Page("job (charted, a day of series)", _job_url(t["charted_job"].job_id), op))
    if t["big_job"] is not None:
        size = t["big_job"].world_size or 0
        pages.append(Page(f"job ({size} ranks)", _job_url(t["big_job"].job_id), op))
    if t["charted_incident"] is not None:
        pages.append(
            Page("incident (charted job)", f"/incidents/{t['charted_incident'].public_id}/", op)
        )
    if t["other_incident"] is not None:
        pages.append(Page("incident", f"/incidents/{t['other_incident'].public_id}/", op))
    pages += [
        Page("jobs", "/jobs/", cu),
        Page("incidents", "/incidents/", cu),
        Page("price", "/price/", cu),
        Page("fleet (operator only)", "/fleet/", cu, expect=404),
    ]
    if t["own_job"] is not None:
        pages.append(Page("job (own)", _job_url(t["own_job"].job_id), cu))
    if t["own_incident"] is not None:
        pages.append(Page("incident (own)", f"/incidents/{t['own_incident'].public_id}/", cu))
    if t["foreign_job"] is not None:
        pages.append(
            Page("job (another customer's)", _job_url(t["foreign_job"].job_id), cu, expect=404)
        )
    return pages


@contextmanager
def _statements() -> Iterator[list[float]]:
    """Count the SQL statements sent meanwhile and the seconds spent waiting on them ([count,
    seconds]): on PostgreSQL at psycopg's cursor, so the plain psycopg cursors some selectors
    use (binary block reads) count as much as the ORM's (psycopg's execute returns once the
    whole result has arrived); on SQLite through Django's execute wrapper."""
    from django.db import connection

    tally = [0.0, 0.0]
    if connection.vendor != "postgresql":

        def wrapper(execute: Any, sql: Any, params: Any, many: Any, context: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                tally[0] += 1
                tally[1] += time.perf_counter() - t0

        with connection.execute_wrapper(wrapper):
            yield tally
        return
    import psycopg

    originals = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def timed(original: Any) -> Any:
        def call(self: Any, *a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(self, *a, **k)
            finally:
                tally[0] += 1
                tally[1] += time.perf_counter() - t0

        return call

    psycopg.Cursor.execute = timed(originals[0])  # type: ignore[method-assign]
    psycopg.Cursor.executemany = timed(originals[1])  # type: ignore[method-assign]
    try:
        yield tally
    finally:
        psycopg.Cursor.execute, psycopg.Cursor.executemany = originals  # type: ignore[method-assign]


def _measure(client: Any, page: Page, repeat: int) -> Measured:
    client.get(page.url)  # warm: templates compiled, caches filled, connection open
    with _statements() as statements:
        response = client.get(page.url)
    times, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        client.get(page.url)
        times.append((time.perf_counter() - t0) * 1000.0)
        cpu.append((time.process_time() - c0) * 1000.0)
    return Measured(
        page.name,
        page.url,
        page.user,
        response.status_code,
        page.expect,
        int(statements[0]),
        _p(times, 0.5),
        _p(times, 0.95),
        max(times) if times else float("nan"),
        _p(cpu, 0.5),
        statements[1] * 1000.0,
        [round(t, 2) for t in times],
    )


def _seed(args: argparse.Namespace) -> None:
    from frontend.seeding import SeedSizes, delete_seeded, seed_console
    from tenants.context import system_context
    from tenants.models import Operator

    with system_context():
        exists = Operator.objects.filter(slug=args.slug).exists()
    if exists and not args.reseed:
        print(f"proof bench console: reusing the seed of operator {args.slug!r} (--reseed: anew)")
        return
    if exists:
        t0 = time.perf_counter()
        delete_seeded(args.slug)
        delete_seeded(f"{args.slug}-other")
        print(f"proof bench console: deleted the old seed in {time.perf_counter() - t0:.1f} s")
    sizes = (
        SeedSizes.tiny()
        if args.tiny
        else SeedSizes(
            nodes=args.nodes,
            jobs=args.jobs,
            incidents=args.incidents,
            customers=args.customers,
            charted_jobs=args.charted_jobs,
            series_hours=args.series_hours,
        )
    )
    print(f"proof bench console: seeding {sizes}", flush=True)
    t0 = time.perf_counter()
    result = seed_console(sizes, slug=args.slug)
    total = time.perf_counter() - t0
    print(
        f"proof bench console: seeded {result.main.gpus:,} GPUs, {result.main.jobs:,} jobs, "
        f"{result.main.incidents:,} incidents in {total:.0f} s:"
    )
    for what, seconds in result.seconds.items():
        print(f"  {what:<34} {seconds:7.1f} s")
    for charted in result.main.charted:
        print(
            f"  charted job {charted.job_id} ({charted.scenario}, {len(charted.nodes)} node(s)): "
            f"{charted.samples:,} samples, {charted.incidents} incident(s) from the detectors"
        )


def run(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client

    # The embedded SQLite, or PostgreSQL as its owner role (proof_web/management/commands/
    # migrate.py) when DATABASE_OWNER_URL is given; without it the schema must be there.
    if not settings.IS_POSTGRES or "owner" in settings.DATABASES:
        call_command("migrate", interactive=False, verbosity=0)
    _seed(args)
    # As in production: no per-query SQL log, no debug pages.
    settings.DEBUG = False
    if "testserver" not in settings.ALLOWED_HOSTS and "*" not in settings.ALLOWED_HOSTS:
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    # The 404s asked for (a customer on an operator page) would log a warning each.
    logging.getLogger("django.request").setLevel(logging.ERROR)
    targets = _targets(args.slug)
    clients: dict[str, Any] = {}
    for key, user in targets["users"].items():
        clients[key] = Client()
        clients[key].force_login(user)
    pages = _pages(targets)
    heap.settle()  # the collector as the web servers set it (proof_web/heap.py)
    # The list pages' own sort/filter/page links.
    for page in list(pages):
        path = urlsplit(page.url).path
        if page.expect != 200 or path.strip("/") not in LIST_PAGES:
            continue
        html = clients[page.user].get(page.url).content.decode("utf-8", "replace")
        for url in _links(html, path, args.links):
            pages.append(Page(f"{page.name} {urlsplit(url).query[:40]}", url, page.user))
    settings_html = clients["operator_admin"].get("/settings/").content.decode("utf-8", "replace")
    for url in _settings_links(settings_html):
        if url != "/settings/":
            pages.append(
                Page(f"settings {url[len('/settings/') :].strip('/')}", url, "operator_admin")
            )
    db = "PostgreSQL" if settings.IS_POSTGRES else "SQLite"
    print(
        f"\nproof bench console: {len(pages)} pages × {args.repeat} requests, Django test client "
        f"in-process ({db}, DEBUG={settings.DEBUG}); server time, ms"
    )
    load_start = os.getloadavg()[0]
    print(
        f"load average {load_start:.1f} on {os.cpu_count()} CPUs "
        "(times on a busy machine are inflated by the wait for a CPU)"
    )
    print(
        f"{'page':<44} {'user':<9} {'status':>6} {'queries':>7} {'p50':>7} {'p95':>7} "
        f"{'max':>7} {'cpu p50':>7} {'sql':>7}"
    )
    results: list[Measured] = []
    for page in pages:
        m = _measure(clients[page.user], page, args.repeat)
        results.append(m)
        who = "operator" if page.user == "operator_admin" else "customer"
        flag = "" if m.status == m.expect else f"  (expected {m.expect})"
        miss = "  > target" if m.p95_ms > args.target_ms else ""
        print(
            f"{m.name[:44]:<44} {who:<9} {m.status:>6} {m.queries:>7} {m.p50_ms:7.1f} "
            f"{m.p95_ms:7.1f} {m.max_ms:7.1f} {m.cpu_p50_ms:7.1f} {m.sql_ms:7.1f}{flag}{miss}",
            flush=True,
        )
    misses = [m for m in results if m.p95_ms > args.target_ms]
    wrong = [m for m in results if m.status != m.expect]
    print(
        f"\np95 ≤ {args.target_ms:g} ms: {len(results) - len(misses)} of {len(results)} pages"
        + ("" if not misses else "; missed by: ")
        + ", ".join(f"{m.name} ({m.user}) +{m.p95_ms - args.target_ms:.0f} ms" for m in misses)
    )
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    all_p95 = [m.p95_ms for m in results]
    if all_p95:
        print(f"median page p95 {statistics.median(all_p95):.1f} ms, worst {max(all_p95):.1f} ms")
    for m in wrong:
        print(f"unexpected status: {m.name} ({m.user}) {m.url} answered {m.status}, not {m.expect}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(
                {
                    "target_ms": args.target_ms,
                    "repeat": args.repeat,
                    "loadavg": [round(load_start, 2), round(os.getloadavg()[0], 2)],
                    "pages": [asdict(m) for m in results],
                },
                out,
                indent=1,
            )
    return 1 if wrong else 0
