"""The console seeder (frontend/seeding/): a tiny seed holds every kind of row the pages read,
in ingest's and investigations' real shapes, and nothing of one operator in the other."""

from __future__ import annotations

import numpy as np
import pytest

from frontend.seeding import SeedResult, SeedSizes, seed_console
from ingest import selectors as ingest_selectors
from ingest.models import Gpu, Job, JobRank, Node, Series, SeriesRollup
from investigations.models import (
    GpuListPrice,
    Incident,
    IncidentState,
    JobActivity,
    JobGpuUsage,
    VerdictRevision,
)
from tenants.context import tenant_context

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def sizes() -> SeedSizes:
    return SeedSizes.tiny()


@pytest.fixture
def seeded(sizes: SeedSizes) -> SeedResult:
    return seed_console(sizes, slug="seedtest", analyze=False)


def test_tiny_seed_has_every_kind_of_row(seeded: SeedResult, sizes: SeedSizes) -> None:
    main = seeded.main
    op = main.operator_id
    with tenant_context(op):
        assert Node.objects.for_tenant(op).count() == sizes.nodes
        assert Gpu.objects.for_tenant(op).count() == sizes.nodes * 8 == main.gpus
        assert Job.objects.for_tenant(op).count() == sizes.jobs
        ranks = JobRank.objects.for_tenant(op).count()
        assert ranks >= sizes.jobs * 8 - 8
        assert JobGpuUsage.objects.for_tenant(op).count() >= ranks - 8
        assert JobActivity.objects.for_tenant(op).count() == sizes.jobs
        assert GpuListPrice.objects.for_tenant(op).count() == 3
        incidents = Incident.objects.for_tenant(op)
        assert incidents.count() == main.incidents
        assert abs(main.incidents - sizes.incidents) <= 10
        assert incidents.filter(state=IncidentState.OPEN).exists()
        assert incidents.filter(state=IncidentState.RESOLVED).exists()
        assert VerdictRevision.objects.for_tenant(op).count() >= main.incidents
        # Open incidents keep the live pipeline's rule: one per job and family.
        keys = list(
            incidents.filter(state=IncidentState.OPEN, job__isnull=False).values_list(
                "job_id", "family"
            )
        )
        assert len(keys) == len(set(keys))
        verdict = incidents.exclude(family="gpu_degrading").filter(job__isnull=False).first()
        assert verdict is not None and verdict.job_id is not None
        job = Job.objects.for_tenant(op).get(pk=verdict.job_id)
        assert verdict.verdict["subject"]["job"] == job.job_id
        assert verdict.verdict["id"] == str(verdict.public_id)
        assert {"evidence", "cleared", "impact", "recommendation"} <= set(verdict.verdict)
        assert SeriesRollup.objects.for_tenant(op).exists()
    # The charted job: a real simulated run, readable through ingest's selectors.
    charted = main.charted[0]
    assert charted.samples > 0
    series = ingest_selectors.job_series(
        op, charted.job_id, seeded_now(seeded) - 300, seeded_now(seeded)
    )
    names = {s.info.name for s in series if len(s.ts)}
    assert {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "cuda.sync_ms"} <= names
    assert all(np.all(np.diff(s.ts) > 0) for s in series)
    logs = ingest_selectors.job_logs(op, charted.job_id, seeded_now(seeded), before_s=600)
    assert any("loss" in row.line for row in logs)  # the framework's training log


def seeded_now(seeded: SeedResult) -> float:
    with tenant_context(seeded.main.operator_id):
        activity = JobActivity.objects.for_tenant(seeded.main.operator_id).order_by(
            "-last_data_ts"
        )[0]
        return float(activity.last_data_ts)


def test_operators_never_share_rows(seeded: SeedResult) -> None:
    main, other = seeded.main.operator_id, seeded.other.operator_id
    with tenant_context(other):
        assert Job.objects.for_tenant(other).count() == SeedSizes.tiny().other_jobs
        assert not Series.objects.filter(operator_id=main).exists()  # RLS: none visible
        other_jobs = set(Job.objects.for_tenant(other).values_list("job_id", flat=True))
    assert seeded.main.charted[0].job_id not in other_jobs
    assert seeded.other.logins["operator_admin"].username == "seedtest-other-admin"


def test_customer_helpers(seeded: SeedResult) -> None:
    login = seeded.customer_login()
    mine = seeded.job_of_customer(login.customer_id)
    assert seeded.main.job_customer[mine] == login.customer_id
    assert login.customer_id is not None
    theirs = seeded.job_not_of_customer(login.customer_id)
    assert seeded.main.job_customer[theirs] != login.customer_id
