"""Seed a console-sized operator: what `proof bench console` measures the pages on, and what
the browser tests sign in to.

`seed_console(sizes)` makes, in the current database:
- the main operator: `sizes.nodes` nodes × 8 GPUs (10,000 GPUs by default), customers with a
  job-mapping rule each, `sizes.jobs` jobs with their ranks, processes, per-GPU usage and data
  activity (frontend/seeding/fleet.py), `sizes.incidents` incidents with real verdicts and
  their revisions (frontend/seeding/verdicts.py), GPU list prices, agent and API tokens,
  users of every role, and series (frontend/seeding/series.py): a simulated day of every
  signal for `sizes.charted_jobs` jobs (with the real detectors' incidents on them), the
  last minutes and hours of every GPU's utilisation, memory, power and temperature, and the
  hardware counters of the GPUs at risk;
- a second operator with a small fleet, jobs and incidents of its own, so that every page
  shows it is never reached across tenants.

Writes are column-wise bulk statements under the operator's tenant context (bulk.py); a
10,000-GPU seed takes minutes. `SeedSizes.tiny()` is what the tests use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from frontend.seeding import bulk
from frontend.seeding import fleet as fleet_seed
from frontend.seeding import series as series_seed
from frontend.seeding import verdicts as verdict_seed
from tenants import services as tenant_services
from tenants.context import tenant_context
from tenants.models import MatchField, Role, TokenScope
from tenants.selectors import principal_for_user

CHARTED_SCENARIOS = (
    "slow_rank",
    "checkpoint_stall",
    "input_starvation",
    "healthy_training",
    "sequence_imbalance",
    "fabric_degraded",
)
CUSTOMER_NAMES = (
    "Acme ML",
    "Borealis AI",
    "Cobalt Labs",
    "Delta Vision",
    "Ember Robotics",
    "Fjord Language",
    "Granite Bio",
    "Halcyon Audio",
)


@dataclass(frozen=True)
class SeedSizes:
    nodes: int = 1250
    customers: int = 24
    jobs: int = 2000
    incidents: int = 20_000
    charted_jobs: int = 4  # jobs with a simulated day of every signal
    charted_nodes: int = 1  # nodes (8 GPUs each) of a charted job
    series_hours: float = 24.0
    fleet_minutes: float = 10.0  # every GPU's recent samples
    fleet_rollup_hours: int = 24  # every GPU's hourly rollups
    health_days: int = 7  # counters of the GPUs at risk
    other_nodes: int = 8  # the second operator's fleet
    other_jobs: int = 20
    other_incidents: int = 60
    seed: int = 11
    # Scenario families the verdict templates come from (empty: all).
    families: tuple[str, ...] = ()

    @classmethod
    def tiny(cls) -> SeedSizes:
        """A few of everything, one charted job of 20 simulated minutes: for tests."""
        return cls(
            nodes=6,
            customers=3,
            jobs=12,
            incidents=40,
            charted_jobs=1,
            series_hours=20 / 60,
            fleet_minutes=2.0,
            fleet_rollup_hours=2,
            health_days=1,
            other_nodes=2,
            other_jobs=3,
            other_incidents=6,
            families=("slow_rank", "checkpoint_stall", "gpu_degrading"),
        )


@dataclass(frozen=True)
class Login:
    username: str
    password: str
    role: str
    customer_id: int | None = None


@dataclass
class OperatorSeed:
    operator_id: int
    slug: str
    customer_ids: list[int]
    logins: dict[str, Login]
    job_ids: list[str] = field(default_factory=list)  # every job id, charted ones first
    job_customer: dict[str, int | None] = field(default_factory=dict)
    charted: list[series_seed.ChartedJob] = field(default_factory=list)
    incidents: int = 0
    gpus: int = 0
    jobs: int = 0  # in the database: the charted runs' neighbour jobs too


@dataclass
class SeedResult:
    main: OperatorSeed
    other: OperatorSeed
    seconds: dict[str, float] = field(default_factory=dict)

    def customer_login(self) -> Login:
        return self.main.logins["customer_viewer"]

    def job_of_customer(self, customer_id: int | None, *, charted: bool = True) -> str:
        """A job of this customer of the main operator (a charted one first)."""
        pool = [c.job_id for c in self.main.charted] if charted else []
        pool += self.main.job_ids
        for job_id in pool:
            if self.main.job_customer.get(job_id) == customer_id:
                return job_id
        raise LookupError(f"no job of customer {customer_id}")

    def job_not_of_customer(self, customer_id: int) -> str:
        for job_id in self.main.job_ids:
            if self.main.job_customer.get(job_id) not in (customer_id, None):
                return job_id
        raise LookupError(f"every job belongs to customer {customer_id}")


class _Clock:
    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds
        self.t = time.perf_counter()

    def lap(self, what: str) -> None:
        now = time.perf_counter()
        self.seconds[what] = self.seconds.get(what, 0.0) + now - self.t
        self.t = now


def _tenant(slug: str, name: str, customers: int, password: str) -> OperatorSeed:
    operator, admin = tenant_services.do_create_operator(
        name=name,
        slug=slug,
        admin_username=f"{slug}-admin",
        admin_email=f"admin@{slug}.example",
        admin_password=password,
    )
    customer_ids = []
    for i in range(customers):
        base = CUSTOMER_NAMES[i % len(CUSTOMER_NAMES)]
        label = base if i < len(CUSTOMER_NAMES) else f"{base} {i // len(CUSTOMER_NAMES) + 1}"
        customer = tenant_services.do_create_customer(
            operator.pk, name=label, slug=f"{slug}-c{i:02d}"
        )
        customer_ids.append(int(customer.pk))
    logins = {"operator_admin": Login(f"{slug}-admin", password, Role.OPERATOR_ADMIN.value)}
    members: list[tuple[str, Role, int | None]] = [
        ("operator_support", Role.OPERATOR_SUPPORT, None)
    ]
    if customer_ids:
        members += [
            ("customer_viewer", Role.CUSTOMER_VIEWER, customer_ids[0]),
            ("customer_admin", Role.CUSTOMER_ADMIN, customer_ids[0]),
        ]
    if len(customer_ids) > 1:
        members.append(("second_customer_viewer", Role.CUSTOMER_VIEWER, customer_ids[1]))
    for key, role, customer_id in members:
        username = f"{slug}-{key.replace('_', '-')}"
        tenant_services.do_create_member(
            operator_id=operator.pk,
            username=username,
            email="",
            password=password,
            role=role,
            customer_id=customer_id,
        )
        logins[key] = Login(username, password, role.value, customer_id)
    principal = principal_for_user(admin)
    if principal is not None:
        for k, customer_id in enumerate(customer_ids):
            tenant_services.do_create_mapping_rule(
                principal,
                match_field=MatchField.SLURM_ACCOUNT,
                value=f"{slug}-c{k:02d}",
                customer_id=customer_id,
            )
        for rack in range(3):
            tenant_services.do_create_agent_token(operator.pk, name=f"{slug} racks {rack}")
        tenant_services.do_create_api_token(principal, name="billing export", scope=TokenScope.READ)
    return OperatorSeed(int(operator.pk), slug, customer_ids, logins)


def _seed_operator(
    slug: str,
    name: str,
    sizes: SeedSizes,
    password: str,
    rng: np.random.Generator,
    now: float,
    clock: _Clock,
) -> OperatorSeed:
    seeded = _tenant(slug, name, sizes.customers, password)
    clock.lap("tenant, users, tokens")
    operator_id = seeded.operator_id
    customer_slugs = [f"{slug}-c{i:02d}" for i in range(sizes.customers)]
    for k in range(sizes.charted_jobs):
        scenario = CHARTED_SCENARIOS[k % len(CHARTED_SCENARIOS)]
        customer = (
            seeded.customer_ids[k % len(seeded.customer_ids)] if seeded.customer_ids else None
        )
        charted = series_seed.seed_charted_job(
            operator_id,
            scenario,
            seed=sizes.seed + k,
            hours=sizes.series_hours,
            nodes=sizes.charted_nodes,
            end_ts=now,
            customer_id=customer,
        )
        seeded.charted.append(charted)
        seeded.job_customer[charted.job_id] = customer
        seeded.gpus += 8 * len(charted.nodes)
    clock.lap("charted jobs: simulate, store")
    if seeded.charted:
        series_seed.roll_up(operator_id, now - sizes.series_hours * 3600.0, now)
        clock.lap("charted jobs: rollups")
        for k, charted in enumerate(seeded.charted):
            found = series_seed.evaluate(operator_id, charted.job_pk)
            seeded.charted[k] = replace(charted, incidents=found)
        clock.lap("charted jobs: detectors")
    charted_nodes = sum(len(c.nodes) for c in seeded.charted)
    # One transaction per step, not one for the whole seed: a seed of minutes must not hold
    # its locks (nor keep its rows unseen) all along — a migration elsewhere waits for them.
    with tenant_context(operator_id):
        fleet_seed.seed_prices(operator_id)
        node_ids, hostnames, node_model, gpu_uuids = fleet_seed.seed_nodes(
            operator_id,
            rng,
            nodes=max(sizes.nodes - charted_nodes, 1),
            gpus_per_node=8,
            prefix=f"{slug[:12]}-gpu",
            now=now,
        )
    seeded.gpus += len(node_ids) * 8
    with tenant_context(operator_id):
        fleet = fleet_seed.seed_jobs(
            operator_id,
            rng,
            jobs=max(sizes.jobs - sum(c.jobs for c in seeded.charted), 1),
            customers=max(len(seeded.customer_ids), 1),
            customer_ids=seeded.customer_ids or [0],
            customer_slugs=customer_slugs or [slug],
            node_ids=node_ids,
            hostnames=hostnames,
            node_model=node_model,
            gpu_uuids=gpu_uuids,
            now=now,
        )
    clock.lap("nodes, GPUs, jobs, ranks, usage")
    charted_incidents = sum(c.incidents for c in seeded.charted)
    with tenant_context(operator_id):
        seeded.incidents, at_risk = verdict_seed.seed_incidents(
            operator_id,
            rng,
            fleet,
            count=max(sizes.incidents - charted_incidents, 0),
            now=now,
            families=sizes.families,
        )
    seeded.incidents += charted_incidents
    clock.lap("incidents, revisions")
    memory = np.array([fleet_seed.GPU_MODELS[int(m)][2] for m in node_model])
    series_seed.seed_fleet_series(
        operator_id,
        rng,
        fleet,
        memory,
        minutes=sizes.fleet_minutes,
        rollup_hours=sizes.fleet_rollup_hours,
        now=now,
    )
    with tenant_context(operator_id):
        series_seed.seed_counter_series(
            operator_id, rng, fleet, at_risk, days=sizes.health_days, now=now
        )
    clock.lap("fleet series, counters")
    seeded.job_ids = [c.job_id for c in seeded.charted] + fleet.job_ids
    seeded.jobs = sum(c.jobs for c in seeded.charted) + len(fleet.job_ids)
    for j, job_id in enumerate(fleet.job_ids):
        c = int(fleet.job_customer[j])
        seeded.job_customer[job_id] = (
            seeded.customer_ids[c] if c >= 0 and seeded.customer_ids else None
        )
    return seeded


def delete_seeded(slug: str) -> bool:
    """Remove operator `slug`, every row it owns and its users (a re-seed starts clean). One
    DELETE per tenant table in one transaction (PostgreSQL checks Django's foreign keys at
    commit), not the ORM's row-by-row cascade over millions of rollups. False if none."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from tenants.context import system_context
    from tenants.models import Membership, Operator
    from tenants.rls import tenant_tables

    with system_context():
        operator = Operator.objects.filter(slug=slug).first()
        if operator is None:
            return False
        users = list(Membership.objects.filter(operator=operator).values_list("user_id", flat=True))
    with transaction.atomic(), tenant_context(operator.pk):
        with connection.cursor() as cursor:
            for table, column in sorted(tenant_tables().items()):
                if column == "operator_id":
                    cursor.execute(
                        f"DELETE FROM {connection.ops.quote_name(table)} WHERE operator_id = %s",  # noqa: S608 - table names from the models' own meta and ingest's registry
                        [operator.pk],
                    )
        get_user_model().objects.filter(pk__in=users).delete()
        Operator.objects.filter(pk=operator.pk).delete()
    return True


def seed_console(
    sizes: SeedSizes | None = None,
    *,
    slug: str = "console",
    password: str = "proof-console-bench",  # noqa: S107 - seeded bench/test logins only
    now: float | None = None,
    analyze: bool = True,
) -> SeedResult:
    """Seed the main operator (`slug`) and a second one (`<slug>-other`); see the module doc.
    The slugs must be new (TenancyError otherwise). `analyze`: refresh the planner's
    statistics afterwards, as the owner (tests, whose rows are never committed, say no)."""
    sizes = sizes or SeedSizes()
    now = time.time() if now is None else now
    rng = np.random.default_rng(sizes.seed)
    seconds: dict[str, float] = {}
    clock = _Clock(seconds)
    main = _seed_operator(slug, "Console GPU Cloud", sizes, password, rng, now, clock)
    other_sizes = replace(
        sizes,
        nodes=sizes.other_nodes,
        customers=min(2, sizes.customers),
        jobs=sizes.other_jobs,
        incidents=sizes.other_incidents,
        charted_jobs=0,
        fleet_rollup_hours=min(sizes.fleet_rollup_hours, 2),
    )
    other_clock = _Clock({})
    other = _seed_operator(
        f"{slug}-other", "Other GPU Cloud", other_sizes, password, rng, now, other_clock
    )
    seconds["second operator"] = sum(other_clock.seconds.values())
    from tenants.rls import tenant_tables

    if analyze:
        clock.t = time.perf_counter()
        bulk.analyze(sorted(tenant_tables()))
        clock.lap("ANALYZE")
    return SeedResult(main, other, seconds)
