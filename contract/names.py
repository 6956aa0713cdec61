"""Name tables written once: the constants of a group are declared one by one, and the tuple
of the whole group is collected from them instead of naming every constant a second time."""

from __future__ import annotations

from collections.abc import Mapping


def prefixed(namespace: Mapping[str, object], prefix: str) -> tuple[str, ...]:
    """The string constants of `namespace` (a module's `globals()`) whose names start with
    `prefix`, in the order they are defined: `EVENT_NAMES = prefixed(globals(), "EVENT_")`."""
    return tuple(v for k, v in namespace.items() if k.startswith(prefix) and isinstance(v, str))
