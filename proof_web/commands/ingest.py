"""`proof ingest`: run the ingest gRPC server (same as `manage.py ingest_server`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ingest.management.commands.ingest_server import add_server_arguments

    add_server_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import django

    django.setup()
    from ingest.management.commands.ingest_server import serve

    return serve(vars(args))
