"""The link `proof demo` prints (scripts/demo.sh) leads to the simulated fleet's verdicts: the
sign-in page, then the console's incidents page, with the demo operator's incident on it."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from investigations.services import merge_verdicts
from investigations.tests.live_helpers import store_gpu_job, verdict
from proof_web.commands.demo import DEMO_OPERATOR_ADMIN, ensure_demo_data, verdicts_url
from tenants.context import tenant_context

pytestmark = pytest.mark.django_db


def test_printed_link_signs_in_to_the_incidents_page(client: Client) -> None:
    ids = ensure_demo_data()
    now = time.time()
    job_pk = store_gpu_job(ids["operator_id"], "demo-job-1", "demo-agent")
    with tenant_context(ids["operator_id"]):
        merge_verdicts(
            ids["operator_id"],
            [verdict(job="demo-job-1", start=now - 120, end=now - 60, title="Demo straggler")],
            window_end=now,
            job_pk=job_pk,
        )
    link = verdicts_url("http://127.0.0.1:8000/")
    path = link.removeprefix("http://127.0.0.1:8000")
    assert path == "/login/?next=/incidents/"
    page = client.get(path)
    assert page.status_code == 200
    assert 'name="next" value="/incidents/"' in page.content.decode()
    response = client.post(
        path,
        {
            "username": DEMO_OPERATOR_ADMIN.username,
            "password": DEMO_OPERATOR_ADMIN.password,
            "next": "/incidents/",
        },
    )
    assert (response.status_code, response["Location"]) == (302, "/incidents/")
    incidents = client.get("/incidents/")
    assert incidents.status_code == 200
    assert "Demo straggler" in incidents.content.decode()
