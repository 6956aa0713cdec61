"""`proof demo`: the embedded stack with demo data, served on one machine.

Migrates the database (SQLite in PROOF_DATA_DIR unless DATABASE_URL says otherwise), makes
sure a demo operator, a customer and two users exist with known passwords, then starts the
whole live stack in this process tree (proof_web/commands/demo_live.py): the ingest gRPC
server on loopback, the in-process task runner (proof_web/runner.py: the periodic schedule of
proof_web/schedule.py and a Celery worker pool running the detectors' tasks), and a
`proof-agent run --backend sim` process per simulated node for docs/design.md §1's four
reference cases plus a healthy job, streaming through the real agent → gRPC → ingest →
detectors path. Each verdict is printed as it appears; daphne serves the web meanwhile.
Ctrl-C stops it all. `--no-agents` skips the agents. Safe to re-run: existing demo rows are
reused and the demo passwords reset; a re-run's agents play the next seed (new jobs).
"""

from __future__ import annotations

import argparse
import errno
import socket
import sys
from dataclasses import dataclass

from contract.cli import NumberOption, add_number_options
from proof_web.commands.demo_live import DEMO_SCENARIOS

DEMO_OPERATOR = ("Demo GPU Cloud", "demo-cloud")
DEMO_CUSTOMER = ("Acme ML", "acme-ml")


@dataclass(frozen=True)
class DemoLogin:
    username: str
    password: str
    role: str
    sees: str


DEMO_OPERATOR_ADMIN = DemoLogin(
    "demo-operator", "proof-demo-operator", "operator_admin", "the whole fleet and every customer"
)
DEMO_CUSTOMER_VIEWER = DemoLogin(
    "demo-customer", "proof-demo-customer", "customer_viewer", "only Acme ML's jobs"
)
DEMO_LOGINS = (DEMO_OPERATOR_ADMIN, DEMO_CUSTOMER_VIEWER)


_NUMBER_OPTIONS: tuple[NumberOption, ...] = (
    ("--port", int, 8000, "port to bind (default 8000)"),
    ("--speed", float, 10.0, "simulated seconds per real second (default 10)"),
    ("--duration", float, 600.0, "simulated seconds of telemetry each agent plays (default 600)"),
    ("--ingest-port", int, 0, "ingest gRPC port on 127.0.0.1 (default: any)"),
    (
        "--exit-after",
        float,
        0.0,
        "stop by itself after this many seconds (default: run until Ctrl-C)",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--setup-only",
        action="store_true",
        help="migrate and create the demo data, then exit without serving",
    )
    parser.add_argument(
        "--no-agents", action="store_true", help="serve and evaluate, but start no sim agents"
    )
    parser.add_argument(
        "--notify-webhook",
        metavar="URL",
        default="",
        help="also POST every verdict to URL as a Standard Webhooks request (the demo "
        "operator's webhook channel; its signing secret is printed)",
    )
    parser.add_argument(
        "--scenarios",
        default=",".join(DEMO_SCENARIOS),
        help="comma-separated simulator scenarios to play (default: the four reference cases "
        "and a healthy job)",
    )
    add_number_options(parser, _NUMBER_OPTIONS)


def ensure_demo_data() -> dict[str, int]:
    """Create the demo tenant and logins if missing; reset the demo passwords. Idempotent.

    Returns the ids of what it ensured (operator, customer) for callers and tests.
    """
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from tenants import services
    from tenants.context import system_context
    from tenants.models import Customer, Membership, Operator, Role

    user_model = get_user_model()
    name, slug = DEMO_OPERATOR
    with transaction.atomic():
        with system_context():
            operator = Operator.objects.filter(slug=slug).first()
        if operator is None:
            operator, _admin = services.do_create_operator(
                name=name,
                slug=slug,
                admin_username=DEMO_OPERATOR_ADMIN.username,
                admin_email="",
                admin_password=DEMO_OPERATOR_ADMIN.password,
            )
        customer_name, customer_slug = DEMO_CUSTOMER
        with system_context():
            customer = Customer.objects.filter(operator=operator, slug=customer_slug).first()
        if customer is None:
            customer = services.do_create_customer(
                operator.pk, name=customer_name, slug=customer_slug
            )
        for login, customer_id in (
            (DEMO_OPERATOR_ADMIN, None),
            (DEMO_CUSTOMER_VIEWER, customer.pk),
        ):
            user = user_model.objects.filter(username=login.username).first()
            if user is None:
                user = user_model.objects.create_user(username=login.username)
            user.set_password(login.password)
            user.is_active = True
            user.save()
            with system_context():
                membership = Membership.objects.filter(user=user).first()
                wanted = (operator.pk, customer_id, login.role)
                if (
                    membership is not None
                    and (
                        membership.operator_id,
                        membership.customer_id,
                        membership.role,
                    )
                    != wanted
                ):
                    membership.delete()  # someone changed the demo user: put it back
                    membership = None
            if membership is None:
                services.do_add_membership(
                    operator_id=operator.pk,
                    user=user,
                    role=Role(login.role),
                    customer_id=customer_id,
                )
    return {"operator_id": operator.pk, "customer_id": customer.pk}


DEMO_WEBHOOK_NAME = "demo webhook"


def ensure_demo_webhook(operator_id: int, url: str) -> str:
    """The demo operator's webhook channel to `url` (created once, kept across runs); returns
    its newest signing secret."""
    from django.utils import timezone

    from notify import services as notify_services
    from notify.models import ChannelKind, NotificationChannel
    from tenants.access import Principal
    from tenants.context import tenant_context
    from tenants.models import Role

    admin = Principal(operator_id, None, Role.OPERATOR_ADMIN, True)
    with tenant_context(operator_id):
        channel = (
            NotificationChannel.objects.for_tenant(operator_id)
            .filter(name=DEMO_WEBHOOK_NAME, kind=ChannelKind.WEBHOOK, target=url)
            .first()
        )
        if channel is not None:
            secrets = notify_services.active_secrets(channel, timezone.now())
            if secrets:
                return secrets[-1]
    created = notify_services.do_create_channel(
        admin, name=DEMO_WEBHOOK_NAME, kind=ChannelKind.WEBHOOK, target=url
    )
    if created.secret is None:  # cannot be: a webhook channel always gets one
        raise RuntimeError("the demo webhook channel was created without a signing secret")
    return created.secret


def _port_free(host: str, port: int) -> str | None:
    """None if host:port can be bound, else why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is already in use (another proof demo?)"
            return f"cannot bind {host}:{port}: {exc.strerror}"
    return None


def run(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    if not 0 < args.port < 65536:
        print(f"proof demo: --port {args.port} is not a TCP port (1-65535)", file=sys.stderr)
        return 2
    database = settings.DATABASES["default"]
    where = (
        f"SQLite at {database['NAME']}"
        if "sqlite" in str(database["ENGINE"])
        else f"PostgreSQL database {database['NAME']}"
    )
    print(f"proof demo: migrating ({where})", flush=True)
    call_command("migrate", interactive=False, verbosity=0)
    ids = ensure_demo_data()
    from billing.services import ensure_demo_plan

    ensure_demo_plan(ids["operator_id"])  # /settings/billing/ shows usage and a projection
    if args.setup_only:
        print("proof demo: demo data ready")
        _print_logins(None)
        return 0
    problem = _port_free(args.host, args.port)
    if problem:
        print(f"proof demo: {problem}; pass --port to use another", file=sys.stderr)
        return 1
    host_in_url = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host_in_url}:{args.port}/"
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    from simulator.scenarios import list_scenarios

    known = {info.name for info in list_scenarios()}
    unknown = [s for s in scenarios if s not in known]
    if unknown:
        print(f"proof demo: unknown scenario(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    if args.notify_webhook:
        secret = ensure_demo_webhook(ids["operator_id"], args.notify_webhook)
        print(
            f"proof demo: verdicts also go to {args.notify_webhook} "
            f"(Standard Webhooks, signing secret {secret})",
            flush=True,
        )
    from proof_web.commands.demo_live import LiveDemo

    live = LiveDemo(
        ids["operator_id"],
        scenarios=scenarios,
        speed=args.speed,
        duration_s=args.duration,
        ingest_port=args.ingest_port,
        agents=not args.no_agents,
    )
    live.start()
    _print_logins(url)
    if args.exit_after > 0:
        import os
        import signal
        import threading

        timer = threading.Timer(args.exit_after, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.daemon = True
        timer.start()
    from daphne.cli import CommandLineInterface

    try:
        CommandLineInterface().run(
            ["--bind", args.host, "--port", str(args.port), "proof_web.asgi:application"]
        )
    finally:
        live.stop()
        print(live.summary(), flush=True)
    return 0


def verdicts_url(url: str) -> str:
    """Where the printed link leads: the console's incidents page (the simulated fleet's
    verdicts as they appear), through the sign-in page."""
    return f"{url}login/?next=/incidents/"


def _print_logins(url: str | None) -> None:
    if url:
        print(f"\nProof is running. The simulated fleet's verdicts: {verdicts_url(url)}")
        print("  (Ctrl-C stops it)")
    print("Sign in with:")
    for login in DEMO_LOGINS:
        print(f"  {login.username:<15} password {login.password:<22} sees {login.sees}")
    if url:
        print(f"Console: {url}   API: {url}api/v1/\n", flush=True)
