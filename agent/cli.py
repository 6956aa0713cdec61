"""`proof-agent`: the node agent's command. Imports no Django.

Subcommands live in their own modules exposing `add_arguments(parser)` and
`run(args) -> int`, imported only when used.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("agent.commands.validate", "check a trace file against format v1"),
    "exec": ("agent.commands.exec", "run a job command, tee and record its output"),
    "doctor": ("agent.commands.doctor", "say which sources work on this node, and why not"),
    "run": ("agent.commands.run", "run the node agent (collect, key, ship to ingest)"),
    "record": ("agent.commands.record", "run the agent and write what it collects as a trace"),
    "bench": ("agent.commands.bench", "measure the agent's cost (--ebpf: uprobe ns per call)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="proof-agent", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        build_parser().print_help()
        return 0 if argv else 2
    name = argv[0]
    if name not in SUBCOMMANDS:
        build_parser().print_help(sys.stderr)
        print(f"\nproof-agent: unknown command {name!r}", file=sys.stderr)
        return 2
    module_path, help_text = SUBCOMMANDS[name]
    module = importlib.import_module(module_path)
    parser = argparse.ArgumentParser(prog=f"proof-agent {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
