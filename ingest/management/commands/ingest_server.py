"""`manage.py ingest_server` (also `proof ingest`): the gRPC server agents stream to.

With --workers N > 1 it runs N server processes on the same port (SO_REUSEPORT: the kernel
spreads connections across them), each with its own writer threads and database connections,
and Prometheus metrics on --metrics-port + worker index.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from contract.cli import NumberOption, add_number_options

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run the ingest gRPC server (agents stream telemetry to it)."

    def add_arguments(self, parser: CommandParser) -> None:
        add_server_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        code = serve(options)
        if code:
            raise CommandError(f"ingest server exited with status {code}")


_NUMBER_OPTIONS: tuple[NumberOption, ...] = (
    ("--port", int, 50051, "gRPC port (default 50051)"),
    ("--workers", int, 1, "server processes (default 1)"),
    ("--writers", int, 2, "storage writer threads per process"),
    (
        "--queue-depth",
        int,
        None,
        "batches queued per process before streams are slowed (default PROOF_INGEST_QUEUE_DEPTH)",
    ),
    ("--max-streams", int, 512, "concurrent streams per process"),
    (
        "--metrics-port",
        int,
        9464,
        "Prometheus metrics HTTP port (worker i uses port + i; 0 disables)",
    ),
)


def add_server_arguments(parser: Any) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--tls-cert", default=None, help="PEM certificate (default: PROOF_INGEST_TLS_CERT)"
    )
    parser.add_argument("--tls-key", default=None, help="PEM key (default: PROOF_INGEST_TLS_KEY)")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow plaintext on a non-loopback address (only behind a TLS-terminating proxy)",
    )
    add_number_options(parser, _NUMBER_OPTIONS)
    parser.add_argument("--metrics-host", default="127.0.0.1")
    parser.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)


def serve(options: dict[str, Any]) -> int:
    if options["workers"] > 1:
        return _supervise(options)
    # Not at module top: `proof`'s parser imports this module for its arguments, and neither
    # it nor the --workers supervisor should load gRPC and the server to do so.
    from prometheus_client import start_http_server

    from ingest.server import IngestServer, InsecureBindRefused

    tls_cert = options["tls_cert"] or settings.INGEST_TLS_CERT
    tls_key = options["tls_key"] or settings.INGEST_TLS_KEY
    try:
        server = IngestServer(
            options["host"],
            options["port"],
            tls_cert=tls_cert,
            tls_key=tls_key,
            insecure=options["insecure"],
            writers=options["writers"],
            queue_depth=options["queue_depth"] or settings.INGEST_QUEUE_DEPTH,
            max_streams=options["max_streams"],
        )
    except (InsecureBindRefused, ValueError, OSError) as exc:
        print(f"ingest: {exc}", file=sys.stderr)
        return 2
    if options["metrics_port"]:
        start_http_server(
            options["metrics_port"] + options["worker_index"], options["metrics_host"]
        )
    port = server.start()
    print(
        f"ingest: listening on {options['host']}:{port} ({'TLS' if tls_cert else 'plaintext'}), "
        f"worker {options['worker_index']}",
        flush=True,
    )
    stopping = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stopping.wait()
    print("ingest: stopping (finishing queued batches)", flush=True)
    server.stop(grace=10)
    return 0


def _supervise(options: dict[str, Any]) -> int:
    """Run `workers` single-process servers on the same port; forward signals; stop all if one
    dies."""
    children = []
    for index in range(options["workers"]):
        argv = [
            sys.executable,
            "-m",
            "django",
            "ingest_server",
            "--workers",
            "1",
            "--worker-index",
            str(index),
        ]
        for key in (
            "host",
            "port",
            "tls_cert",
            "tls_key",
            "writers",
            "queue_depth",
            "max_streams",
            "metrics_port",
            "metrics_host",
        ):
            if options[key] is not None:
                argv += [f"--{key.replace('_', '-')}", str(options[key])]
        if options["insecure"]:
            argv.append("--insecure")
        children.append(subprocess.Popen(argv))  # noqa: S603 - our interpreter and manage.py, with this command's own options

    def forward(signum: int, frame: Any) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [child.wait() for child in children]
    return max(codes)
