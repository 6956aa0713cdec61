"""Query counts of the tenancy, channel and share-link lists (docs/api.md): pinned from one
row of each kind to nine. Here, above the apps, because the rows come from several of them."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from investigations import services as investigation_services
from investigations.models import Incident
from investigations.tests.live_helpers import job_pk, store_gpu_job, verdict
from notify import services as notify_services
from tenants import services
from tenants.context import system_context, tenant_context
from tenants.testing import Tenant, tenant_fixtures
from tenants.tests.test_api import session
from tenants.tests.test_api_conventions import make_customers

pytestmark = pytest.mark.django_db

a, _b = tenant_fixtures("qca", "qcb")


def _grow(a: Tenant, rows: int, start: int) -> None:
    """`rows` more of every kind of row the pinned lists show (numbered from `start`)."""
    admin = a.principal(a.operator_admin)
    customers = make_customers(a, rows, start)
    with system_context():
        incident_pks = list(
            Incident.objects.filter(operator=a.operator).values_list("pk", flat=True)
        )
    for n in range(rows):
        a.api_token(a.operator_admin, scope="read")
        services.do_create_agent_token(admin, name=f"rack {start + n}")
        services.do_create_mapping_rule(
            admin,
            match_field="slurm_account",
            value=f"acct-{start + n}",
            customer_id=customers[n],
        )
        notify_services.do_create_channel(
            admin,
            name=f"hook {start + n}",
            kind="webhook",
            target=f"http://127.0.0.1:9/{start + n}",
            rules=[{"families": ["xid_error"]}],
        )
    for pk in incident_pks:
        with system_context():
            public_id = Incident.objects.get(pk=pk).public_id
        for _ in range(rows):
            investigation_services.do_create_share_link(
                admin, incident=public_id, expires_in_s=3600
            )


PINNED_LISTS = [
    "/api/v1/customers/",
    "/api/v1/api-tokens/",
    "/api/v1/agent-tokens/",
    "/api/v1/job-mapping-rules/",
    "/api/v1/notification-channels/",
    "/api/v1/share-links/",
]


@pytest.mark.parametrize("path", PINNED_LISTS)
def test_list_query_counts_do_not_grow_with_rows(a: Tenant, path: str) -> None:
    op = a.operator.pk
    store_gpu_job(op, "qc-1", "qc-agent")
    with tenant_context(op):
        investigation_services.merge_verdicts(
            op, [verdict(job="qc-1")], window_end=1_100, job_pk=job_pk(op, "qc-1")
        )
    client = session(a.operator_admin)

    def count() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(path)
            assert response.status_code == 200
        return len(queries), len(response.json()["results"])

    _grow(a, 1, start=0)
    few, shown_few = count()
    _grow(a, 8, start=1)
    many, shown_many = count()
    assert shown_many > shown_few
    assert many == few
