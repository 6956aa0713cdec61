"""The agent (and the contract, simulator and engine below or beside it) installs and imports
without the server stack.

A GPU node runs `pip install proof[agent]` and `proof-agent`; nothing there may need Django,
Celery, DRF, Channels or a PostgreSQL driver. Checked two ways: every agent module imports in
a fresh interpreter where those packages cannot be imported, and the dependencies the agent
install pulls name none of them. Hardware libraries (bcc, DCGM bindings) must be imported
lazily by the collectors that use them, so they are not excused here either.
"""

from __future__ import annotations

import ast
import concurrent.futures
import json
import re
import subprocess
import tomllib
from pathlib import Path

from tests.agentproc import run_python

REPO = Path(__file__).resolve().parent.parent
SERVER_ONLY = ("django", "celery", "psycopg", "rest_framework", "channels", "daphne", "kombu")
FORBIDDEN_DISTRIBUTIONS = re.compile(
    r"^(django.*|djangorestframework.*|celery.*|psycopg.*|channels.*|daphne|kombu)$"
)

_PROBE = r"""
import importlib, importlib.abc, json, pkgutil, sys, traceback

BLOCKED = set(sys.argv[1].split(","))

class BlockServerStack(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is server-only and must not be imported by the agent")
        return None

sys.meta_path.insert(0, BlockServerStack())
failures = {}
imported = []

def record(name):
    failures[name] = traceback.format_exc(limit=-3)

import agent, contract, engine, simulator

for pkg in (agent, contract, simulator, engine):
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".", onerror=record):
        name = info.name
        if ".tests" in name or name.endswith(("_test", ".conftest")):
            continue
        try:
            importlib.import_module(name)
            imported.append(name)
        except BaseException:
            record(name)

leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps({"imported": imported, "failures": failures, "leaked": leaked}))
"""


def _probe(code: str) -> subprocess.CompletedProcess[str]:
    """`python -c CODE` with the server packages blocked, without Django settings."""
    return run_python(["-c", code, ",".join(SERVER_ONLY)])


def test_every_agent_module_imports_without_the_server_stack() -> None:
    result = _probe(_PROBE)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"agent.cli", "contract.signals", "simulator.run", "engine.analyze"} <= set(
        report["imported"]
    )
    assert not report["failures"], (
        "agent modules that fail to import without the server stack:\n"
        + "\n".join(f"--- {name}\n{trace}" for name, trace in report["failures"].items())
    )
    assert report["leaked"] == []


def test_the_probe_really_blocks_server_packages() -> None:
    probe = (
        _PROBE.split("failures = {}")[0] + "import django\n"  # must raise
    )
    result = _probe(probe)
    assert result.returncode != 0
    assert "django is server-only" in result.stderr


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, f"cannot parse requirement {requirement!r}"
    return match.group(1).lower().replace("_", "-")


def _agent_install_requirements() -> list[str]:
    """Base dependencies plus the agent extra, following self-references like proof[x]."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    todo: list[str] = list(project["dependencies"])
    seen_extras: set[str] = set()

    def add_extra(extra: str) -> None:
        if extra not in seen_extras:
            seen_extras.add(extra)
            todo.extend(extras.get(extra, []))

    add_extra("agent")
    names = []
    while todo:
        requirement = todo.pop()
        name = _requirement_name(requirement)
        if name == project["name"]:
            inner = re.search(r"\[([^\]]+)\]", requirement)
            for extra in inner.group(1).split(",") if inner else []:
                add_extra(extra.strip())
            continue
        names.append(name)
    return names


def test_agent_install_pulls_no_server_dependencies() -> None:
    names = _agent_install_requirements()
    assert "grpcio" in names  # the parse found the real list
    offending = [name for name in names if FORBIDDEN_DISTRIBUTIONS.match(name)]
    assert offending == [], f"the agent install would pull server packages: {offending}"


def _agent_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import of `agent` or `agent.*` anywhere in the module: at the
    top, inside functions and classes, and `importlib.import_module("agent…")`/`__import__`."""
    found: list[tuple[int, str]] = []

    def is_agent(name: str | None) -> bool:
        return bool(name) and (name == "agent" or name.startswith("agent."))  # type: ignore[union-attr]

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if is_agent(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and is_agent(node.module):
            found.append((node.lineno, str(node.module)))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if (
                name in ("import_module", "__import__")
                and isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and is_agent(arg.value)
            ):
                found.append((node.lineno, arg.value))
    return sorted(found)


def test_no_module_outside_the_agent_imports_it() -> None:
    """The agent is a separate program: the server, the contract, the simulator, the engine,
    the end-to-end tests and the scripts drive it as an operator does (`proof-agent …` in a
    subprocess) and never import it. Every tracked .py file outside agent/ is parsed."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.py"],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    paths = [p for p in listed.split("\0") if p and not p.startswith("agent/")]
    assert "tests/test_import_boundary.py" in paths  # the listing found the real tree

    def scan() -> list[str]:
        found: list[str] = []
        for rel in paths:
            path = REPO / rel
            if not path.exists():  # deleted in the working tree, not yet committed
                continue
            tree = ast.parse(path.read_bytes(), filename=rel)
            found += [f"{rel}:{line}: {module}" for line, module in _agent_imports(tree)]
        return found

    # Parsed on a thread of its own: CPython 3.11's parser keeps a recursion depth per thread,
    # and after an earlier test of the suite ran deep recursion on this one (the fuzz and
    # hostile-input tests) ast.parse raised "AST constructor recursion depth mismatch" on a
    # valid file (contract/wire/encode.py, in CI's full run; alone it parses).
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        offenders = pool.submit(scan).result(timeout=300)
    assert offenders == [], "modules outside agent/ that import the agent:\n" + "\n".join(offenders)


def test_the_agent_import_scan_sees_every_form() -> None:
    source = (
        "import agent\nimport agentless, os\nfrom agent.spool import Spool\n"
        "from agents import x\nfrom . import agent\n"
        "def f():\n    import agent.cli as c\n    importlib.import_module('agent.transport.sink')\n"
        "class C:\n    from agent import config\n"
    )
    assert [m for _, m in _agent_imports(ast.parse(source))] == [
        "agent",
        "agent.spool",
        "agent.cli",
        "agent.transport.sink",
        "agent",
    ]
