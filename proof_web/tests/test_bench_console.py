"""`proof bench console` on a tiny seed: it finds what to ask each page about, every page
answers what it must (200, or 404 for the customer on the operator's fleet and on another
customer's job), and it counts statements and times requests; and its link picking."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from frontend.seeding import SeedSizes, delete_seeded, seed_console
from ingest.models import Job
from proof_web.commands import bench_console
from tenants.context import system_context, tenant_context
from tenants.models import Operator

pytestmark = pytest.mark.django_db


def test_links_are_the_pages_own_query_links() -> None:
    html = (
        '<a href="/jobs/?sort=job">Job</a> <a href="/jobs/?sort=job">again</a> '
        '<a href="?page=2&amp;sort=job">Next</a> <a href="/jobs/4800/">a job</a> '
        '<a href="/incidents/?job=4800">its verdicts</a> <a href="https://x.example/?a=1">x</a>'
    )
    assert bench_console._links(html, "/jobs/", 4) == ["/jobs/?sort=job", "/jobs/?page=2&sort=job"]
    many = " ".join(f'<a href="/jobs/?page={i}">{i}</a>' for i in range(10))
    assert len(bench_console._links(many, "/jobs/", 4)) == 4
    assert bench_console._settings_links(
        '<a href="/settings/users/">u</a><a href="/settings/?x=1">x</a><a href="/jobs/">j</a>'
    ) == ["/settings/users/"]


def test_every_page_answers_as_it_must_on_a_tiny_seed(settings: Any) -> None:
    settings.DEBUG = False
    seed_console(SeedSizes.tiny(), slug="benchtest", analyze=False)
    targets = bench_console._targets("benchtest")
    assert targets["charted_job"] is not None and targets["charted_incident"] is not None
    assert targets["foreign_job"] is not None
    clients = {}
    for key, user in targets["users"].items():
        clients[key] = Client()
        clients[key].force_login(user)
    pages = bench_console._pages(targets)
    assert {p.url for p in pages} >= {"/fleet/", "/jobs/", "/incidents/", "/price/"}
    for page in pages:
        measured = bench_console._measure(clients[page.user], page, repeat=1)
        assert measured.status == page.expect, (page.name, page.user, measured.status)
        assert measured.queries > 0 and measured.p95_ms > 0


def test_delete_seeded_removes_the_operator_and_its_rows() -> None:
    seeded = seed_console(SeedSizes.tiny(), slug="deltest", analyze=False)
    assert delete_seeded("deltest")
    assert not delete_seeded("deltest")
    with system_context():
        assert not Operator.objects.filter(slug="deltest").exists()
        assert Operator.objects.filter(slug="deltest-other").exists()
    with tenant_context(seeded.main.operator_id):
        assert not Job.objects.filter(operator_id=seeded.main.operator_id).exists()
