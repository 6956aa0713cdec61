"""A simulated node's hardware in its own process, for `proof-agent bench`.

On a GPU node the readings' source is not the agent: the driver answers NVML, nv-hostengine
answers pydcgm over a socket, the kernel fills the eBPF maps. `SimNodeProcess` plays that part
for a simulated run: a child process holds the run (its arrays: ~3.5 MiB per simulated hour
per 8 GPUs, plus the simulator's modules), the `SimFeed` and the simulated DCGM host engine;
the measured process keeps only what an agent on a node keeps:

- one proxy collector per `sim_backend.SOURCES` entry, handing over what that source's
  collector would have read this interval (one pipe round trip per interval, all sources);
- the real `DcgmCollector`, whose bindings ask the child's host engine for GetLatest of each
  field group (as pydcgm asks nv-hostengine), so the collector's own cost is measured.

The simulator (and numpy, which it needs) is imported in the child only: in the measured
process it was ~22 MiB of RSS that an agent on a node does not have (issue 17). The child
says which sources there are in its first message.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from agent.collectors.dcgm import MAX_FIELDS_PER_GROUP, Bindings, DcgmCollector
from agent.collectors.dcgm_sim import GROUP_ALL_GPUS, OPERATION_MODE_AUTO, SimFieldValue
from agent.runtime.base import Record


def _serve(
    conn: Any, scenario: str, seed: int, duration_s: float, start_ts: float, gpus: int
) -> None:
    """The child: simulate, then answer 'tick' (release and hand over every source's records)
    and 'latest' (the host engine's values for field ids) until 'stop'."""
    # Here, not at the top: only the child may load the simulator (see the module's note).
    from agent.runtime.sim_backend import SOURCE_DCGM, SOURCES, SimBackend, SimDcgmSource

    first = SimBackend.from_scenario(
        scenario,
        seed=seed,
        duration_s=duration_s,
        start_ts=start_ts,
        nodes=1,
        gpus_per_node=gpus,
    )
    # The scenario may place a neighbour job on a second node: play only the first node.
    node = str(first.trace_meta()[0]["nodes"][0])
    backend = SimBackend(
        first.run, node=node, start_ts=start_ts, duration_s=duration_s, dcgm_fields=True
    )
    del first
    dcgm = next(c for c in backend.collectors() if isinstance(c, SimDcgmSource))
    engine = dcgm.engine
    feed = backend.feed
    conn.send(
        {
            "node": node,
            "uuids": engine.uuids,
            "gpus": [g.index for g in engine.gpus],
            "sources": list(SOURCES),
            "dcgm_source": SOURCE_DCGM,
        }
    )
    while True:
        msg = conn.recv()
        op = msg[0]
        if op == "tick":
            now = msg[1]
            feed.release(now)
            out = {s: feed.take(s) for s in SOURCES}
            out.pop(SOURCE_DCGM)  # recorded profiling samples: the collector reads them
            dcgm.set_time(now)
            conn.send(out)
        elif op == "latest":
            per_gpu = engine.latest(msg[1])
            conn.send(
                {
                    g: {f: (v.value, v.ts, v.isBlank) for f, (v,) in row.items()}
                    for g, row in per_gpu.items()
                }
            )
        else:
            conn.send("bye")
            return


class SimNodeProcess:
    """The parent side: start the child, then `collectors()` for the agent loop."""

    def __init__(
        self,
        scenario: str,
        *,
        seed: int,
        duration_s: float,
        start_ts: float,
        gpus: int,
        ctx: Any = None,
    ) -> None:
        ctx = ctx or multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve,
            args=(child, scenario, seed, duration_s, start_ts, gpus),
            name="bench-sim-node",
            daemon=True,
        )
        self._proc.start()
        hello = self._conn.recv()
        self.node: str = hello["node"]
        uuids: list[str] = hello["uuids"]
        indices: list[int] = hello["gpus"]
        self.sources: list[str] = hello["sources"]  # sim_backend.SOURCES, in poll order
        self._dcgm_source: str = hello["dcgm_source"]
        self.start_ts = start_ts
        self.end_ts = start_ts + duration_s
        self._now: float | None = None
        self._records: dict[str, list[Record]] = {}
        by_index = dict(zip(indices, uuids, strict=True))
        self.dcgm = DcgmCollector(node=self.node, bindings=self._bindings(), gpu_uuid=by_index.get)

    def _tick(self, now: float) -> None:
        if self._now != now:
            self._conn.send(("tick", now))
            self._records = self._conn.recv()
            self._now = now

    def _take(self, source: str, now: float) -> list[Record]:
        self._tick(now)
        return self._records.pop(source, [])

    def _latest(self, field_ids: list[int]) -> dict[int, dict[int, list[SimFieldValue]]]:
        self._conn.send(("latest", field_ids))
        raw = self._conn.recv()
        return {
            g: {f: [SimFieldValue(f, v, ts, blank)] for f, (v, ts, blank) in row.items()}
            for g, row in raw.items()
        }

    def _bindings(self) -> Bindings:
        node = self

        class Samples:
            def WatchFields(self, fg: Any, freq_us: int, age_s: float, keep: int) -> None:
                pass  # the simulated engine has every value at every sample

            def GetLatest(self, fg: Any) -> Any:
                return SimpleNamespace(values=node._latest(fg.fieldIds))

        class DcgmFieldGroup:
            def __init__(self, handle: Any, name: str = "", fieldIds: list[int] | None = None):
                ids = list(fieldIds or [])
                if len(ids) > MAX_FIELDS_PER_GROUP:
                    raise ValueError(f"DCGM_ST_MAX_LIMIT: {len(ids)} fields in one group")
                self.name, self.fieldIds = name, ids

        def handle(ipAddress: str | None = None, opMode: int = 0) -> Any:
            return SimpleNamespace(Shutdown=lambda: None)

        return Bindings(
            pydcgm=SimpleNamespace(
                DcgmHandle=handle,
                DcgmGroup=lambda handle, groupId=None: SimpleNamespace(samples=Samples()),
                DcgmFieldGroup=DcgmFieldGroup,
            ),
            dcgm_structs=SimpleNamespace(
                DCGM_GROUP_ALL_GPUS=GROUP_ALL_GPUS, DCGM_OPERATION_MODE_AUTO=OPERATION_MODE_AUTO
            ),
        )

    def collectors(self) -> list[Any]:
        """One per sim_backend.SOURCES entry, in order; the DCGM one is the real collector."""
        out: list[Any] = []
        for source in self.sources:
            if source == self._dcgm_source:
                out.append(self.dcgm)
            else:
                out.append(_Proxy(source, self._take))
        return out

    def close(self) -> None:
        self.dcgm.close()
        if self._proc.is_alive():
            try:
                self._conn.send(("stop",))
                self._conn.recv()
            except (OSError, EOFError):
                pass
            self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()


class _Proxy:
    """What one simulated source's collector read this interval."""

    def __init__(self, source: str, take: Callable[[str, float], list[Record]]) -> None:
        self.name = source
        self._take = take

    def collect(self, now: float) -> list[Record]:
        return self._take(self.name, now)
