"""Inference servers on the node: vLLM, SGLang and TGI, discovered from their command lines
(or configured), scraped over their Prometheus endpoints, mapped to docs/design.md §4.

Discovery reads `<proc>/<pid>/cmdline`:
  vLLM    `vllm serve MODEL`, `python -m vllm.entrypoints.openai.api_server` (port 8000)
  SGLang  `python -m sglang.launch_server` (port 30000)
  TGI     `text-generation-launcher` (port from --port, else PORT in its environment — the
          official image sets PORT=80 — else the launcher's documented default 3000; a
          `--prometheus-port`, where given, is scraped instead)
Several processes with the same endpoint (API-server workers) collapse to the lowest pid.

Names: vLLM's pass through. SGLang's and TGI's are mapped to the closest vLLM name where one
exists (table below; `labels.server` says which server it came from), else kept with their own
names. Histogram buckets, `_created` and `*_info` series are not forwarded (they are hundreds
of series per scrape and carry no signal the detectors use).

Batch slots -> `inference.max_num_seqs`: vLLM `--max-num-seqs`, SGLang
`--max-running-requests`, TGI `--max-batch-size` else `--max-concurrent-requests` (or their
MAX_BATCH_SIZE / MAX_CONCURRENT_REQUESTS environment variables). Emitted only when the value is
on the command line / environment or configured: the servers' built-in defaults differ by
version and hardware, and a guessed capacity would mislead the saturation detectors.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.collectors._common import FetchFn, Record, WarnOnce, as_number, http_get
from agent.collectors.prometheus import Scraper
from contract import signals
from contract.parsers.prometheus import Scrape

log = logging.getLogger(__name__)

VLLM = "vllm"
SGLANG = "sglang"
TGI = "tgi"
AUTO = "auto"  # a configured URL: which server it is, is read off its metric names

SGLANG_NAMES: dict[str, str] = {
    "sglang:num_running_reqs": signals.VLLM_NUM_REQUESTS_RUNNING,
    "sglang:num_queue_reqs": signals.VLLM_NUM_REQUESTS_WAITING,
    "sglang:token_usage": signals.VLLM_KV_CACHE_USAGE_PERC,
    "sglang:prompt_tokens_total": signals.VLLM_PROMPT_TOKENS_TOTAL,
    "sglang:generation_tokens_total": signals.VLLM_GENERATION_TOKENS_TOTAL,
}
TGI_NAMES: dict[str, str] = {
    "tgi_batch_current_size": signals.VLLM_NUM_REQUESTS_RUNNING,
    "tgi_queue_size": signals.VLLM_NUM_REQUESTS_WAITING,
    # Histogram sums of per-request token counts are the cumulative token totals.
    "tgi_request_input_length_sum": signals.VLLM_PROMPT_TOKENS_TOTAL,
    "tgi_request_generated_tokens_sum": signals.VLLM_GENERATION_TOKENS_TOTAL,
}
_NAME_MAPS: dict[str, dict[str, str]] = {VLLM: {}, SGLANG: SGLANG_NAMES, TGI: TGI_NAMES}
_PREFIXES: dict[str, str] = {VLLM: "vllm:", SGLANG: "sglang:", TGI: "tgi_"}
_DEFAULT_PORTS: dict[str, int] = {VLLM: 8000, SGLANG: 30000, TGI: 3000}
_SLOT_FLAGS: dict[str, tuple[str, ...]] = {
    VLLM: ("--max-num-seqs",),
    SGLANG: ("--max-running-requests",),
    TGI: ("--max-batch-size", "--max-concurrent-requests"),
}
_SLOT_ENV: dict[str, tuple[str, ...]] = {TGI: ("MAX_BATCH_SIZE", "MAX_CONCURRENT_REQUESTS")}


@dataclass
class InferenceServer:
    server: str  # vllm / sglang / tgi
    url: str  # the /metrics URL
    pid: int | None = None
    max_num_seqs: int | None = None
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_url(cls, url: str, *, max_num_seqs: int | None = None) -> InferenceServer:
        """A configured endpoint (`[inference] endpoints`); the server kind is detected."""
        return cls(AUTO, url, None, max_num_seqs)


def _flag(argv: list[str], *names: str) -> str | None:
    """Value of `--name V` or `--name=V`; underscores and dashes are interchangeable."""
    wanted = {n.replace("_", "-") for n in names}
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        key, eq, val = arg.partition("=")
        if key.replace("_", "-") in wanted:
            if eq:
                return val
            if i + 1 < len(argv):
                return argv[i + 1]
    return None


def classify(argv: list[str]) -> str | None:
    """Which inference server a command line starts, or None."""
    for i, arg in enumerate(argv):
        base = os.path.basename(arg)
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if base == "vllm" and nxt == "serve":
            return VLLM
        if arg.startswith("vllm.entrypoints.") and ("api_server" in arg):
            return VLLM
        if arg == "sglang.launch_server" or (base == "sglang" and nxt == "serve"):
            return SGLANG
        if base in ("text-generation-launcher", "text-generation-router"):
            return TGI
    return None


def server_from_cmdline(
    argv: list[str], environ: dict[str, str] | None = None, pid: int | None = None
) -> InferenceServer | None:
    kind = classify(argv)
    if kind is None:
        return None
    env = environ or {}
    port_text = _flag(argv, "--port")
    if kind == TGI:
        port_text = (
            _flag(argv, "--prometheus-port")
            or env.get("PROMETHEUS_PORT")
            or port_text
            or env.get("PORT")
        )
    host = _flag(argv, "--host", "--hostname") or "127.0.0.1"
    if host in ("0.0.0.0", "::", "", "[::]"):  # noqa: S104 - not a bind: a server listening on every interface is scraped on loopback
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    try:
        port = int(port_text) if port_text else _DEFAULT_PORTS[kind]
    except ValueError:
        port = _DEFAULT_PORTS[kind]
    slots: int | None = None
    for flag_name in _SLOT_FLAGS[kind]:
        text = _flag(argv, flag_name)
        if text is not None and text.isdigit():
            slots = int(text)
            break
    if slots is None:
        for var in _SLOT_ENV.get(kind, ()):
            if env.get(var, "").isdigit():
                slots = int(env[var])
                break
    return InferenceServer(kind, f"http://{host}:{port}/metrics", pid, slots)


def discover(proc_root: str | Path = "/proc") -> list[InferenceServer]:
    """Inference servers running under `proc_root`, one per metrics endpoint (lowest pid)."""
    root = Path(proc_root)
    found: dict[str, InferenceServer] = {}
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            raw = (root / entry.name / "cmdline").read_bytes()
        except OSError:
            continue  # the process exited, or is not ours to read
        argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
        if not argv or classify(argv) is None:
            continue
        environ: dict[str, str] = {}
        try:
            for item in (root / entry.name / "environ").read_bytes().split(b"\0"):
                k, sep, v = item.decode("utf-8", "replace").partition("=")
                if sep:
                    environ[k] = v
        except OSError:
            pass
        pid = int(entry.name)
        srv = server_from_cmdline(argv, environ, pid)
        if srv is None:
            continue
        current = found.get(srv.url)
        if current is None or (current.pid is not None and pid < current.pid):
            found[srv.url] = srv
    return sorted(found.values(), key=lambda s: (s.pid or 0, s.url))


class InferenceCollector:
    """Scrapes every discovered (and configured) inference server once per `collect()`."""

    name = "inference"

    def __init__(
        self,
        *,
        node: str | None = None,
        proc_root: str | Path = "/proc",
        endpoints: list[InferenceServer] | None = None,
        discover_processes: bool = True,
        rediscover_s: float = 30.0,
        fetch: FetchFn = http_get,
        timeout_s: float = 2.0,
        discover_fn: Callable[[str | Path], list[InferenceServer]] = discover,
    ) -> None:
        self.node = node
        self._proc_root = proc_root
        self._configured = list(endpoints or [])
        self._discover_processes = discover_processes
        self._rediscover_s = rediscover_s
        self._fetch = fetch
        self._timeout_s = timeout_s
        self._discover_fn = discover_fn
        self._warn = WarnOnce(log)
        self._servers: list[InferenceServer] = list(self._configured)
        self._scrapers: dict[str, Scraper] = {}
        self._discovered_at: float | None = None

    @property
    def servers(self) -> list[InferenceServer]:
        return list(self._servers)

    def _refresh(self, now: float) -> None:
        if not self._discover_processes:
            return
        if self._discovered_at is not None and now - self._discovered_at < self._rediscover_s:
            return
        self._discovered_at = now
        configured_urls = {s.url for s in self._configured}
        found = [s for s in self._discover_fn(self._proc_root) if s.url not in configured_urls]
        self._servers = self._configured + found
        live = {s.url for s in self._servers}
        for url in list(self._scrapers):
            if url not in live:
                del self._scrapers[url]

    def collect(self, now: float) -> list[Record]:
        self._refresh(now)
        out: list[Record] = []
        for srv in self._servers:
            scraper = self._scrapers.get(srv.url)
            if scraper is None:
                scraper = Scraper(
                    srv.url, fetch=self._fetch, timeout_s=self._timeout_s, warn=self._warn
                )
                self._scrapers[srv.url] = scraper
            ident: dict[str, Any] = {}
            if self.node:
                ident[signals.NODE] = self.node
            if srv.pid is not None:
                ident[signals.PID] = srv.pid
            scrape = scraper.scrape()
            if srv.max_num_seqs is not None:
                kind = srv.server
                if kind == AUTO and scrape is not None:
                    kind = detect_server(scrape) or AUTO
                rec: Record = {
                    "type": "sample",
                    "ts": now,
                    "name": signals.INFERENCE_MAX_NUM_SEQS,
                    "value": srv.max_num_seqs,
                    "labels": {"server": kind, **srv.labels},
                }
                rec.update(ident)
                out.append(rec)
            if scrape is not None:
                out.extend(map_scrape(scrape, srv, now, ident))
        return out


def detect_server(scrape: Scrape) -> str | None:
    """vllm / sglang / tgi from the metric names of a scrape, or None."""
    for s in scrape.samples:
        for kind, prefix in _PREFIXES.items():
            if s.name.startswith(prefix):
                return kind
    return None


def map_scrape(
    scrape: Scrape, srv: InferenceServer, now: float, ident: dict[str, Any] | None = None
) -> list[Record]:
    """A server's scrape as sample records named per docs/design.md §4."""
    kind = srv.server if srv.server != AUTO else detect_server(scrape)
    if kind is None:
        return []
    prefix = _PREFIXES[kind]
    names = _NAME_MAPS[kind]
    out: list[Record] = []
    for s in scrape.samples:
        name = s.name
        if not name.startswith(prefix):
            continue
        if name.endswith(("_bucket", "_created", "_info")):
            continue
        value = s.value
        if value != value or value in (float("inf"), float("-inf")):
            continue
        labels = dict(s.labels)
        labels["server"] = kind
        if srv.labels:
            labels.update(srv.labels)
        rec: Record = {
            "type": "sample",
            "ts": now,
            "name": names.get(name, name),
            "value": as_number(value),
            "labels": labels,
        }
        if ident:
            rec.update(ident)
        out.append(rec)
    return out
