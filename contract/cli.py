"""The one subcommand dispatcher behind `proof` and `proof-agent`.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`run(args) -> int`; a module is imported only when its subcommand runs, so `--help` stays fast
and a subcommand's dependencies (Django for `proof manage`, bcc for `proof-agent bench --ebpf`)
are loaded only by the command that needs them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable, Mapping, Sequence

# name -> (module, one-line help)
Subcommands = Mapping[str, tuple[str, str]]
# A numeric option: (flag, int or float, default, help).
NumberOption = tuple[str, type[int] | type[float], float | None, str]


def build_parser(prog: str, description: str, subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module_path, help_text) in subcommands.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def dispatch(
    prog: str, description: str, subcommands: Subcommands, argv: Sequence[str] | None = None
) -> int:
    """Run the subcommand `argv[0]` with the rest of argv (the command line's by default); 2 for
    a missing or unknown one."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        build_parser(prog, description, subcommands).print_help()
        return 0 if argv else 2
    name = argv[0]
    if name not in subcommands:
        build_parser(prog, description, subcommands).print_help(sys.stderr)
        print(f"\n{prog}: unknown command {name!r}", file=sys.stderr)
        return 2
    module_path, help_text = subcommands[name]
    module = importlib.import_module(module_path)
    parser = argparse.ArgumentParser(prog=f"{prog} {name}", description=help_text)
    module.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    return int(module.run(args) or 0)


def add_number_options(parser: argparse.ArgumentParser, options: Iterable[NumberOption]) -> None:
    """Add numeric options from a table: commands with many knobs read as one list of them."""
    for flag, kind, default, text in options:
        parser.add_argument(flag, type=kind, default=default, help=text)
