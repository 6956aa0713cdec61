"""The agent runtime's interfaces: records, collectors, sinks and clocks.

Records in the runtime are plain trace dicts (docs/design.md §5: `{"type": "sample", "ts": …,
"name": …, "value": …, "node": …}`). That is deliberate for the hot path: a small dict is the
cheapest object CPython builds (cheaper than a slotted dataclass's `__init__`), collectors and
the simulator already speak it, the trace writer and the gRPC encoder consume it without a
conversion, and it carries unknown keys for free. `contract.trace.from_dict` turns one into a typed
record where that reads better.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

Record = dict[str, Any]


@runtime_checkable
class Collector(Protocol):
    """A source of records, polled once per agent interval.

    `collect(now)` returns what the source has seen since the previous call, stamped at or
    before `now` (seconds since the epoch, from the agent's clock). A collector whose source is
    unreadable logs that once and returns [] (it is retried every interval); an exception that
    escapes `collect` is caught by the agent, counted and reported as one `collector_error`
    event, and the agent keeps running.
    """

    name: str

    def collect(self, now: float) -> list[Record]: ...


@runtime_checkable
class Sink(Protocol):
    """Where the agent hands each interval's records: a trace file, memory, or the transport.

    `submit` must not block for long (a network sink spools and sends in the background);
    `flush` pushes what was submitted to durable storage or the wire; `close` flushes and frees.
    """

    def submit(self, records: Sequence[Record]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class Clock(Protocol):
    """Time as the agent sees it (injectable: real, accelerated or manual)."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Wall-clock time."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class AcceleratedClock:
    """Simulated time running `speed` times faster than real time from `start_ts`.

    `speed=60` plays a minute per second. `speed=0` (or `math.inf`) means no waiting at all:
    `sleep` just advances the clock, so a simulated hour is recorded as fast as it computes.
    """

    def __init__(self, start_ts: float, speed: float = 1.0) -> None:
        if speed < 0:
            raise ValueError(f"speed must be >= 0, got {speed}")
        self.speed = speed
        self.virtual = speed == 0 or speed == float("inf")
        self._start_ts = start_ts
        self._virtual_now = start_ts
        self._m0 = time.monotonic()

    def now(self) -> float:
        if self.virtual:
            return self._virtual_now
        return self._start_ts + (time.monotonic() - self._m0) * self.speed

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if self.virtual:
            self._virtual_now += seconds
        else:
            time.sleep(seconds / self.speed)


class ManualClock:
    """A clock that only moves when told to (tests): `sleep` advances it."""

    def __init__(self, start_ts: float = 0.0) -> None:
        self.t = start_ts

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.t += seconds

    def advance(self, seconds: float) -> None:
        self.t += seconds
