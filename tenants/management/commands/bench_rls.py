"""`proof manage bench_rls`: what a tenant or system context costs per transaction.

Against the PostgreSQL in DATABASE_URL (migrated, with at least one operator: `proof demo` or
`proof manage create_operator` makes one), as the application role, `--n` transactions of each:

- `set_config`: BEGIN, `SELECT set_config('proof.operator_id', …, true)`, a one-row read,
  COMMIT — what a tenant context cost before the grants (the setting no longer admits a row; it
  is timed as the baseline only);
- `tenant_context`: the same read in `tenant_context(operator)` (the proof_rls_set() grant);
- `tenant_context + customers`: a count over tenants_customer there (the policy's two InitPlans);
- `system_context`: the same count in `system_context()`.

Prints microseconds per transaction (median and p95 of `--rounds` rounds of `--n`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction

from tenants.context import system_context, tenant_context
from tenants.selectors import operator_ids


class Command(BaseCommand):
    help = "Time a tenant/system context per transaction (PostgreSQL)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--n", type=int, default=2000, help="transactions per round")
        parser.add_argument("--rounds", type=int, default=5)

    def handle(self, *args: Any, **options: Any) -> None:
        if connection.vendor != "postgresql":
            raise CommandError("bench_rls needs PostgreSQL: set DATABASE_URL")
        n, rounds = int(options["n"]), int(options["rounds"])
        if n < 1 or rounds < 1:
            raise CommandError("--n and --rounds must be at least 1")
        ids = operator_ids()
        if not ids:
            raise CommandError("no operator in this database: create one first")
        operator = ids[0]

        def read(sql: str) -> Callable[[], None]:
            def run() -> None:
                with connection.cursor() as cursor:
                    cursor.execute(sql)
                    cursor.fetchall()

            return run

        def baseline() -> None:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT set_config('proof.operator_id', %s, true)", [str(operator)])
                cursor.execute("SELECT 1")
                cursor.fetchall()

        one_row, customers = read("SELECT 1"), read("SELECT count(*) FROM tenants_customer")

        def in_tenant(body: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                with tenant_context(operator):
                    body()

            return run

        def in_system() -> None:
            with system_context():
                customers()

        cases: list[tuple[str, Callable[[], None]]] = [
            ("set_config (old mechanism, baseline)", baseline),
            ("tenant_context", in_tenant(one_row)),
            ("tenant_context + customers count", in_tenant(customers)),
            ("system_context + customers count", in_system),
        ]
        self.stdout.write(f"{n} transactions x {rounds} rounds, operator {operator}")
        for name, case in cases:
            for _ in range(min(n, 200)):  # warm up: connection, plans, caches
                case()
            per_tx: list[float] = []
            for _ in range(rounds):
                start = time.perf_counter()
                for _ in range(n):
                    case()
                per_tx.append((time.perf_counter() - start) / n * 1e6)
            p95 = sorted(per_tx)[max(0, round(0.95 * len(per_tx)) - 1)]
            self.stdout.write(
                f"{name:40s} median {statistics.median(per_tx):7.1f} us/tx   p95 {p95:7.1f} us/tx"
            )
