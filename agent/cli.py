"""`proof-agent`: the node agent's command. Imports no Django.

Subcommands live in their own modules exposing `add_arguments(parser)` and
`run(args) -> int`, imported only when used.
"""

from __future__ import annotations

import sys

from agent import __version__
from contract import cli

DESCRIPTION = (__doc__ or "").splitlines()[0]

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("agent.commands.validate", "check a trace file against format v1"),
    "exec": ("agent.commands.exec", "run a job command, tee and record its output"),
    "doctor": ("agent.commands.doctor", "say which sources work on this node, and why not"),
    "run": ("agent.commands.run", "run the node agent (collect, key, ship to ingest)"),
    "record": ("agent.commands.record", "run the agent and write what it collects as a trace"),
    "bench": ("agent.commands.bench", "measure the agent's cost (--ebpf: uprobe ns per call)"),
    "gpu-smoke": ("agent.commands.gpu_smoke", "smoke-check the agent on this node's real GPU"),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--version"]:  # the packaged executable's smoke check (docs/agent-install.md)
        print(f"proof-agent {__version__}")
        return 0
    return cli.dispatch("proof-agent", DESCRIPTION, SUBCOMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
