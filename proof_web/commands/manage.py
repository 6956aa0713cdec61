"""`proof manage ARGS…` is `manage.py ARGS…`, for installs without the repository checkout."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs=argparse.REMAINDER, help="management command and options")


def run(args: argparse.Namespace) -> int:
    from django.core.management import execute_from_command_line

    execute_from_command_line(["proof manage", *args.args])
    return 0
