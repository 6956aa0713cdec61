"""The scenario registry: a scenario is a name, a one-line description and a builder.

    @register("healthy_training", kind="training", family=None, description="...")
    def build(ctx: ScenarioContext) -> SimRun: ...

Builders live in `simulator/training_scenarios.py` and `simulator/inference.py`; both are
imported on first use of the registry so that `list_scenarios()` sees every scenario.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simulator.run import SimRun

_BUILTIN_MODULES = ("simulator.training_scenarios", "simulator.inference")


@dataclass(frozen=True)
class ScenarioInfo:
    name: str
    kind: str  # "training" | "inference"
    family: str | None  # docs/design.md §6 family, None for a healthy control
    description: str


@dataclass
class ScenarioContext:
    """What a builder gets: the caller's knobs (None = the builder randomises) and the RNG."""

    scenario: str
    seed: int
    rng: np.random.Generator
    duration_s: float
    nodes: int | None
    gpus_per_node: int | None
    start_ts: float
    interval_s: float = 1.0

    @property
    def n_samples(self) -> int:
        return max(1, round(self.duration_s / self.interval_s))


Builder = Callable[[ScenarioContext], SimRun]

_REGISTRY: dict[str, tuple[ScenarioInfo, Builder]] = {}
_loaded = False


class UnknownScenario(KeyError):
    def __str__(self) -> str:
        names = ", ".join(sorted(_REGISTRY))
        return f"unknown scenario {self.args[0]!r}; known: {names}"


def register(
    name: str, *, kind: str, family: str | None, description: str
) -> Callable[[Builder], Builder]:
    def deco(builder: Builder) -> Builder:
        if name in _REGISTRY and _REGISTRY[name][1] is not builder:
            raise ValueError(f"scenario {name!r} registered twice")
        _REGISTRY[name] = (ScenarioInfo(name, kind, family, description), builder)
        return builder

    return deco


def unregister(name: str) -> None:
    """Forget a scenario; for tests that register their own and must not leak it into others
    that iterate over every scenario."""
    _REGISTRY.pop(name, None)


def _load_builtin() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            # simulator/inference.py is written separately; until it exists the registry simply
            # lacks its scenarios. Any other missing module is a real error.
            if exc.name != module:
                raise


def get(name: str) -> tuple[ScenarioInfo, Builder]:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownScenario(name) from None


def list_scenarios() -> list[ScenarioInfo]:
    _load_builtin()
    return [info for info, _ in sorted(_REGISTRY.values(), key=lambda v: (v[0].kind, v[0].name))]
