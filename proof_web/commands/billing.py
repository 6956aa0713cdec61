"""`proof billing …`: metering and licences from the command line (docs/billing.md).

proof billing usage --month 2028-02 [--operator SLUG]   GPU-days, GPU-months, the invoice
proof billing meter --month 2028-02 [--operator SLUG]   (re)compute the month's rows from
                                                        the stored rollups (existing stand)
proof billing chargeback --month 2028-02 --operator SLUG [--out FILE]   per customer, CSV
proof billing export --month 2028-02 --operator SLUG [--out FILE]       signed usage report
proof billing licence                                   check the licence now
proof billing keygen --out FILE                         a new Ed25519 key (PEM) to sign with
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    for name, text in (
        ("usage", "print a month's GPU-days, GPU-months and priced invoice"),
        ("meter", "compute a month's daily usage rows from the stored rollups"),
        ("chargeback", "per-customer GPUs, GPU-hours, productive share and real price (CSV)"),
        ("export", "write the month's usage report signed with the site's Ed25519 key"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--month", required=True, help="YYYY-MM")
        p.add_argument("--operator", default=None, help="operator slug (default: every one)")
        if name in ("chargeback", "export"):
            p.add_argument("--out", default="-", help="file to write (default: stdout)")
    bench = sub.add_parser("bench", help="time the daily usage computation on a synthetic fleet")
    bench.add_argument("--month", default="2028-02", help="YYYY-MM (default 2028-02)")
    bench.add_argument("--gpus", type=int, default=1000)
    bench.add_argument("--days", type=int, default=0, help="default: the whole month")
    sub.add_parser("licence", help="check the licence file now and print the result")
    keygen = sub.add_parser("keygen", help="write a new Ed25519 private key (PEM)")
    keygen.add_argument("--out", required=True)


def _write(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {path}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from billing import commands

    try:
        return commands.run(args.action, vars(args), _write)
    except (ValueError, LookupError) as exc:
        print(f"proof billing {args.action}: {exc}", file=sys.stderr)
        return 2
