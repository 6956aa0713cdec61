"""The work behind `proof billing …` (proof_web/commands/billing.py parses the arguments)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

from billing import licence, metering, selectors
from billing.bench import run_bench
from billing.pricing import days_in_month, next_month, parse_month
from tenants.access import Principal
from tenants.roles import Role
from tenants.selectors import operator_by_slug, operator_slugs

Writer = Callable[[str, str], None]


def _operators(slug: str | None) -> list[tuple[int, str]]:
    if slug:
        operator = operator_by_slug(slug)
        if operator is None:
            raise LookupError(f"no operator with slug {slug!r}")
        return [(int(operator.pk), operator.slug)]
    return list(operator_slugs().items())


def _usage(month: date, operators: list[tuple[int, str]]) -> str:
    lines = []
    for op, slug in operators:
        priced = selectors.priced_month(op, month)
        lines.append(
            f"{slug}  {month:%Y-%m}  GPU-days {priced.gpu_days}  "
            f"GPU-months {priced.gpu_months:.4f}  ({priced.gpu_days} / "
            f"{(next_month(month) - month).days} days)  "
            f"invoice {priced.total} {priced.currency}"
        )
        for line in priced.lines:
            lines.append(
                f"    {line.description:<32} {line.gpu_months:>10.4f} × {line.unit_price}"
                f" = {line.amount}"
            )
    return "\n".join(lines) + "\n"


def run(action: str, options: dict[str, Any], write: Writer) -> int:
    if action == "licence":
        status = licence.check()
        if status is None:
            write("-", "no licence configured (PROOF_LICENCE_FILE is not set)\n")
            return 0
        write("-", f"{'valid' if status.valid else 'NOT VALID'}: {status.message}\n")
        return 0 if status.valid else 1
    if action == "keygen":
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        Path(options["out"]).write_bytes(pem)
        write("-", f"wrote {options['out']}; public key {licence.public_key_b64(key)}\n")
        return 0
    month = parse_month(options["month"])
    if action == "bench":
        result = run_bench(options["gpus"], options["days"] or days_in_month(month), month)
        write("-", "\n".join(result.lines()) + "\n")
        return 0
    operators = _operators(options.get("operator"))
    if action == "usage":
        write("-", _usage(month, operators))
        return 0
    if action == "meter":
        last = min(next_month(month), datetime.now(UTC).date()) - timedelta(days=1)
        for op, slug in operators:
            results = metering.do_meter_range(op, month, last)
            write("-", f"{slug}: {sum(r.new_rows for r in results)} new rows\n")
        return 0
    if len(operators) != 1:
        raise ValueError(f"{action} needs --operator SLUG")
    [(op, slug)] = operators
    if action == "chargeback":
        principal = Principal(
            operator_id=op, customer_id=None, role=Role.OPERATOR_ADMIN, can_write=False
        )
        write(options["out"], selectors.chargeback_csv(principal, month))
        return 0
    if action == "export":
        if not settings.BILLING_EXPORT_KEY_FILE:
            raise ValueError(
                "PROOF_BILLING_EXPORT_KEY_FILE is not set (make one: proof billing keygen --out FILE)"
            )
        key = licence.load_private_key(settings.BILLING_EXPORT_KEY_FILE)
        report = licence.signed_report(op, slug, month, key)
        write(options["out"], json.dumps(report, indent=2, sort_keys=True) + "\n")
        return 0
    raise ValueError(f"unknown action {action!r}")
