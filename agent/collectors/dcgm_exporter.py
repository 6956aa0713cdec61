"""dcgm-exporter as a source: scrape an existing exporter's `/metrics` and map its series to
the docs/design.md §4 GPU vocabulary with docs/design.md §3 identity.

dcgm-exporter already uses the DCGM field names, so names pass through (with the one rename
below); what this collector adds is identity: `UUID` -> `gpu`, `gpu` -> `gpu_index`,
`Hostname` -> `node` (unless the agent was given its own node name), and Kubernetes
`pod`/`namespace`/`container` (present when the exporter runs with pod mapping) -> `job` =
the pod name, with namespace and container kept as labels. Series without a GPU identity
(no `UUID` and no `gpu` label) cannot be attributed and are dropped.

A change of `DCGM_FI_DEV_XID_ERRORS` (the last XID the GPU raised) to a non-zero value is also
reported as an `xid` event, so clusters without kernel-log access still get XIDs.
"""

from __future__ import annotations

import logging
from typing import Any

from agent.collectors._common import FetchFn, Record, WarnOnce, as_number, event, http_get
from agent.collectors.prometheus import Scraper
from contract import signals
from contract.parsers.prometheus import Scrape

log = logging.getLogger(__name__)

# Newer DCGM renamed "clock throttle reasons" to "clock event reasons"; same bitmask.
_RENAMES = {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": signals.DCGM_FI_DEV_CLOCK_THROTTLE_REASONS}
_XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
# Labels turned into identity keys, or dropped as static metadata (driver versions, serials:
# constant per GPU and already known to the NVML/doctor side).
_IDENTITY_LABELS = frozenset({"UUID", "gpu", "Hostname", "pod"})
_KEPT_LABELS = ("modelName", "device", "pci_bus_id", "namespace", "container", "GPU_I_ID")


class DcgmExporterCollector:
    """Scrapes a dcgm-exporter endpoint once per `collect()`."""

    name = "dcgm_exporter"

    def __init__(
        self,
        url: str = "http://127.0.0.1:9400/metrics",
        *,
        node: str | None = None,
        fetch: FetchFn = http_get,
        timeout_s: float = 2.0,
    ) -> None:
        self.node = node
        self._scraper = Scraper(url, fetch=fetch, timeout_s=timeout_s, warn=WarnOnce(log))
        self._last_xid: dict[str, float] = {}
        # id(labels dict) -> (that dict, identity, kept labels); see _identity.
        self._ident_cache: dict[
            int, tuple[dict[str, str], dict[str, Any] | None, dict[str, str]]
        ] = {}

    def collect(self, now: float) -> list[Record]:
        scrape = self._scraper.scrape()
        if scrape is None:
            return []
        return self.records_from(scrape, now)

    def records_from(self, scrape: Scrape, now: float) -> list[Record]:
        out: list[Record] = []
        for s in scrape.samples:
            name = s.name
            if not name.startswith("DCGM_"):
                continue
            value = s.value
            if value != value or value in (float("inf"), float("-inf")):
                continue
            ident, labels = self._identity(s.labels)
            if ident is None:
                continue
            name = _RENAMES.get(name, name)
            rec: Record = {"type": "sample", "ts": now, "name": name, "value": as_number(value)}
            rec.update(ident)
            if labels:
                rec["labels"] = labels
            out.append(rec)
            if name == _XID_FIELD:
                key = str(ident.get(signals.GPU, ident.get(signals.GPU_INDEX)))
                previous = self._last_xid.get(key)
                self._last_xid[key] = value
                if value and value != previous:
                    out.append(
                        event(
                            now,
                            signals.EVENT_XID,
                            value=int(value),
                            text=f"dcgm-exporter {_XID_FIELD}={int(value)}",
                            **ident,
                        )
                    )
        return out

    def _identity(self, raw: dict[str, str]) -> tuple[dict[str, Any] | None, dict[str, str]]:
        # Keyed by the labels dict's identity: the scraper's parse cache hands out the same
        # dict for the same label block every scrape. The entry keeps `raw` alive, so its id
        # cannot be reused by another dict while cached.
        cached = self._ident_cache.get(id(raw))
        if cached is not None and cached[0] is raw:
            return cached[1], cached[2]
        ident: dict[str, Any] | None = None
        labels: dict[str, str] = {}
        uuid = raw.get("UUID")
        index = raw.get("gpu")
        if uuid or (index and index.isdigit()):
            ident = {}
            node = self.node or raw.get("Hostname")
            if node:
                ident[signals.NODE] = node
            if uuid:
                ident[signals.GPU] = uuid
            if index and index.isdigit():
                ident[signals.GPU_INDEX] = int(index)
            if raw.get("pod"):
                ident[signals.JOB] = raw["pod"]
            labels = {k: raw[k] for k in _KEPT_LABELS if raw.get(k)}
        if len(self._ident_cache) > 4096:  # pods come and go; never grow without bound
            self._ident_cache.clear()
        self._ident_cache[id(raw)] = (raw, ident, labels)
        return ident, labels
