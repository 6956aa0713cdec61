"""The typing policy in pyproject.toml: mypy runs strict over the whole project, and the modules
exempt from it are few and only ever fewer."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# The most modules the exemption list may name. Lower it when you strictify a module; never
# raise it.
MAX_EXEMPT = 2

# What the exemption list may relax: per-module strictness flags, never a whole module's errors.
RELAXABLE = {
    "disallow_untyped_defs",
    "disallow_incomplete_defs",
    "disallow_untyped_calls",
    "disallow_untyped_decorators",
    "disallow_any_generics",
    "disallow_subclassing_any",
    "warn_return_any",
    "warn_unused_ignores",
}
GENERATED = {"contract.wire.ingest_pb2", "contract.wire.ingest_pb2_grpc"}


def _mypy() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    return config


def _overrides() -> list[dict[str, Any]]:
    overrides: list[dict[str, Any]] = _mypy().get("overrides", [])
    return overrides


def _modules(block: dict[str, Any]) -> list[str]:
    module = block["module"]
    return [module] if isinstance(module, str) else list(module)


def _exemption_list() -> dict[str, Any]:
    """The one block that relaxes strictness for project modules."""
    blocks = [b for b in _overrides() if RELAXABLE & b.keys()]
    assert len(blocks) == 1, f"one exemption block, not {len(blocks)}"
    return blocks[0]


def project_modules() -> list[Path]:
    """Every Python module of the project, tests included: not migrations, not the virtual
    environment or build output, not the generated protobuf modules."""
    found = []
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if any(p.startswith(".") or p in ("build", "migrations", "__pycache__") for p in parts):
            continue
        if "_pb2" in path.name:
            continue
        found.append(path)
    return found


def test_mypy_is_strict_everywhere() -> None:
    config = _mypy()
    assert config.get("strict") is True
    assert config.get("warn_unused_ignores") is True
    assert "ignore_missing_imports" not in config, "untyped imports are allowed per module only"
    for block in _overrides():
        # Whole modules skipped: only the generated protobuf code.
        if block.get("ignore_errors") or block.get("follow_imports") == "skip":
            assert set(_modules(block)) <= GENERATED, block
        # No block turns strict off wholesale.
        assert "strict" not in block, block


def test_untyped_imports_are_third_party_only() -> None:
    """ignore_missing_imports is for libraries that ship no types, never for our own code."""
    ours = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    for block in _overrides():
        if block.get("ignore_missing_imports"):
            for module in _modules(block):
                assert module.split(".")[0] not in ours, module


def test_exemption_list_only_shrinks() -> None:
    exempt = _modules(_exemption_list())
    assert len(exempt) == len(set(exempt))
    assert len(exempt) <= MAX_EXEMPT, (
        f"{len(exempt)} modules exempt from strict typing, at most {MAX_EXEMPT}: type the new "
        "code instead of exempting it"
    )
    total = len(project_modules())
    assert total > 100, total  # the count found the project
    assert MAX_EXEMPT / total <= 0.2, (MAX_EXEMPT, total)
    # Every exempt module exists (a stale name would hide that the list could shrink).
    for module in exempt:
        stem = ROOT / module.replace(".", "/")
        assert stem.with_suffix(".py").exists() or (stem / "__init__.py").exists(), module


def test_every_other_relaxation_is_for_an_exempt_module() -> None:
    """Any other per-module relaxation (disabled error codes) names only modules that the
    exemption list already counts."""
    exempt = set(_modules(_exemption_list()))
    for block in _overrides():
        if "disable_error_code" in block:
            assert set(_modules(block)) <= exempt, block
