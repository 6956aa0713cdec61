"""InfiniBand / RoCE port counters from sysfs:
`<sysfs>/class/infiniband/<device>/ports/<port>/counters/*` and `hw_counters/*`.

Every counter is cumulative and reported as read (detectors take deltas), one sample per
counter with `labels.device`, `labels.port` and `labels.link_layer` (InfiniBand / Ethernet,
i.e. RoCE). The docs/design.md §4 counters use their normative names (`ib.port_xmit_data`, …); every
other file in `counters/` and `hw_counters/` is reported as `ib.<file name>`
(e.g. `ib.out_of_buffer`, `ib.roce_adp_retrans`) unless `all_counters=False`.

Units: `port_xmit_data` and `port_rcv_data` count 4-byte words (the IBA spec's "octets
divided by 4"), so they are multiplied by 4 and reported in **bytes**. Counters that read
"N/A" (some RoCE ports) are skipped.

A port whose `state` leaves ACTIVE between two collects yields a `link_down` event.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from agent.collectors._common import Record, WarnOnce, event
from contract import signals

log = logging.getLogger(__name__)

NORMATIVE: dict[str, str] = {
    "port_xmit_data": signals.IB_PORT_XMIT_DATA,
    "port_rcv_data": signals.IB_PORT_RCV_DATA,
    "port_xmit_wait": signals.IB_PORT_XMIT_WAIT,
    "symbol_error": signals.IB_SYMBOL_ERROR,
    "link_downed": signals.IB_LINK_DOWNED,
    "link_error_recovery": signals.IB_LINK_ERROR_RECOVERY,
    "port_rcv_errors": signals.IB_PORT_RCV_ERRORS,
}
WORD_COUNTERS = frozenset({"port_xmit_data", "port_rcv_data"})  # 4-byte words → bytes
IB_PREFIX = signals.IB_PREFIX


def _read(path: str) -> str | None:
    # os.open/os.read: a third of the cost of open().read() for these one-line sysfs files,
    # which matters at ~50 files per port every second.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 256).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


class InfinibandCollector:
    name = "infiniband"

    def __init__(
        self, sysfs_root: str | Path = "/sys", *, all_counters: bool = True, rescan_s: float = 60.0
    ) -> None:
        self.root = Path(sysfs_root) / "class" / "infiniband"
        self.all_counters = all_counters
        self.rescan_s = rescan_s
        # (device, port, port dir, [(counter file path, sample name, multiplier)]), rebuilt
        # every rescan_s: listing ~50 files per port every second would double the cost.
        self._layout: list[tuple[str, str, str, list[tuple[str, str, int]]]] | None = None
        self._scanned_at = 0.0
        self._warn = WarnOnce(log)
        self._states: dict[tuple[str, str], str] = {}
        self._names: dict[str, str] = {}

    def _name(self, counter: str) -> str:
        name = self._names.get(counter)
        if name is None:
            name = NORMATIVE.get(counter) or IB_PREFIX + counter
            self._names[counter] = name
        return name

    def _scan(self) -> list[tuple[str, str, str, list[tuple[str, str, int]]]] | None:
        try:
            devices = sorted(os.listdir(self.root))
        except OSError as exc:
            self._warn.fail("root", "no InfiniBand devices under %s: %s", self.root, exc)
            return None
        self._warn.ok("root")
        layout = []
        for dev in devices:
            ports_dir = self.root / dev / "ports"
            try:
                ports = sorted(os.listdir(ports_dir))
            except OSError:
                continue
            for port in ports:
                pdir = str(ports_dir / port)
                layout.append((dev, port, pdir, self._counter_files(pdir)))
        return layout

    def _counter_files(self, pdir: str) -> list[tuple[str, str, int]]:
        """(path, signal name, multiplier) of each counter file of one port to read."""
        files: list[tuple[str, str, int]] = []
        for sub in ("counters", "hw_counters"):
            cdir = pdir + "/" + sub
            try:
                names = sorted(os.listdir(cdir))
            except OSError:
                continue
            for counter in names:
                if not self.all_counters and counter not in NORMATIVE:
                    continue
                mult = 4 if counter in WORD_COUNTERS else 1
                files.append((cdir + "/" + counter, self._name(counter), mult))
        return files

    def collect(self, now: float) -> list[Record]:
        if self._layout is None or now - self._scanned_at >= self.rescan_s:
            self._layout = self._scan()
            self._scanned_at = now
        if self._layout is None:
            return []
        out: list[Record] = []
        for dev, port, pdir, files in self._layout:
            self._port(dev, port, pdir, files, now, out)
        return out

    def _port(
        self,
        dev: str,
        port: str,
        pdir: str,
        files: list[tuple[str, str, int]],
        now: float,
        out: list[Record],
    ) -> None:
        # One labels dict per port, shared by its samples (read-only downstream; saves ~50
        # dict builds per port per second).
        labels = {"device": dev, "port": port}
        link_layer = _read(pdir + "/link_layer")
        if link_layer:
            labels["link_layer"] = link_layer
        state = _read(pdir + "/state")
        if state is not None:
            previous = self._states.get((dev, port))
            self._states[(dev, port)] = state
            if previous is not None and "ACTIVE" in previous and "ACTIVE" not in state:
                out.append(
                    event(
                        now,
                        signals.EVENT_LINK_DOWN,
                        text=f"{dev} port {port}: {previous} -> {state}",
                        labels=dict(labels),
                    )
                )
        for path, name, mult in files:
            text = _read(path)
            if text is None:
                continue
            try:
                value = int(text) * mult
            except ValueError:
                continue  # "N/A (not available)" on some RoCE ports
            out.append(
                {"type": "sample", "ts": now, "name": name, "value": value, "labels": labels}
            )
