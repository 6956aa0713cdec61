"""`proof-agent doctor`: which sources work on this node, and why not for the others.

    proof-agent doctor [--config /etc/proof-agent/proof-agent.toml] [--json]

One line per source: OK with what was found, `unavailable` with the reason and what to do,
or `off` when the config turns it off. Exit status 0 whatever is unavailable (a node without
InfiniBand is not broken); 2 only when the config file itself is wrong. Every check is guarded,
and those that need an optional piece (pynvml, bcc, the transport) import it in a guard, so
doctor runs on any node, in the single-file executable, without the optional pieces.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import ssl
import sys
import time
import urllib.error
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.collectors import kubernetes_collector
from agent.collectors._common import open_http
from agent.collectors.dcgm import DEFAULT_BINDINGS_PATHS, Bindings, DcgmCollector
from agent.collectors.kubernetes import PodResourcesClient, socket_readable
from agent.collectors.nvml import NvmlCollector
from agent.config import AgentConfig, ConfigError, load_config
from agent.spool import DEAD_LETTER_DIR, DeadLetter

OK, UNAVAILABLE, OFF = "OK", "unavailable", "off"
# Not a source that is missing: something the operator should look at (batches ingest refused).
ATTENTION = "attention"


@dataclass
class Check:
    source: str
    status: str
    detail: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="config file (default: the usual path)")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument(
        "--timeout", type=float, default=2.0, help="seconds for each network check (default 2)"
    )


def check_nvml(cfg: AgentConfig) -> Check:
    if not cfg.nvml.enabled:
        return Check("NVML", OFF, "[nvml] enabled = false")
    try:
        import pynvml  # optional hardware library (nvidia-ml-py): absent off GPU nodes
    except ImportError:
        return Check("NVML", UNAVAILABLE, "nvidia-ml-py (pynvml) is not installed")
    col = NvmlCollector(pynvml, node=cfg.agent.node or None)
    if not col.start():
        return Check("NVML", UNAVAILABLE, col.unavailable_reason or "unknown")
    facts = col.node_facts()
    models = sorted({g["model"] for g in facts["gpus"]})
    detail = (
        f"{len(facts['gpus'])} GPU(s) {', '.join(models)}; driver {facts['driver_version']}, "
        f"CUDA {facts['cuda_version']}"
    )
    col.close()
    return Check("NVML", OK, detail)


def check_dcgm_bindings(
    cfg: AgentConfig, *, bindings: Bindings | None = None, settle_s: float = 1.5
) -> Check:
    """Connect, watch the field table, read twice `settle_s` apart (the host engine samples
    a newly watched field within one update interval) and list the fields each GPU answered
    NOT_SUPPORTED: those the agent skips there."""
    if cfg.dcgm.mode != "bindings":
        return Check("DCGM bindings", OFF, f"[dcgm] mode = {cfg.dcgm.mode!r}")
    paths = [
        cfg.dcgm.bindings_path,
        *(p for p in DEFAULT_BINDINGS_PATHS if p != cfg.dcgm.bindings_path),
    ]
    col = DcgmCollector(
        node=cfg.agent.node or None, host=cfg.dcgm.host, bindings_paths=paths, bindings=bindings
    )
    if not col.start():
        return Check("DCGM bindings", UNAVAILABLE, col.unavailable_reason or "unknown")
    try:
        read = len(col.collect(time.time()))
        if settle_s > 0:
            time.sleep(settle_s)
        read = max(read, len(col.collect(time.time() + col.slow_every_s)))
        unsupported = col.unsupported_fields()
    finally:
        col.close()
    detail = f"{len(col.fields)} fields watched via {cfg.dcgm.host}, {read} values read"
    if unsupported:
        per_gpu = "; ".join(
            f"GPU {gpu}: {len(names)} not supported, skipped ({', '.join(names)})"
            for gpu, names in unsupported.items()
        )
        detail += f"; {per_gpu}"
    return Check("DCGM bindings", OK, detail)


def check_dcgm_exporter(cfg: AgentConfig, timeout: float) -> Check:
    if cfg.dcgm.mode != "exporter":
        return Check("dcgm-exporter", OFF, f"[dcgm] mode = {cfg.dcgm.mode!r}")
    url = cfg.dcgm.exporter_url
    try:
        with open_http(url, timeout) as resp:
            text = resp.read(4 * 1024 * 1024).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return Check("dcgm-exporter", UNAVAILABLE, f"{url}: {_reason(exc)}")
    fields = {
        line.split("{", 1)[0].split(" ", 1)[0]
        for line in text.splitlines()
        if line.startswith("DCGM_FI_")
    }
    if not fields:
        return Check("dcgm-exporter", UNAVAILABLE, f"{url} answered but has no DCGM_FI_ metrics")
    prof = sum(1 for f in fields if f.startswith("DCGM_FI_PROF_"))
    return Check("dcgm-exporter", OK, f"{url}: {len(fields)} DCGM fields ({prof} profiling)")


def check_ebpf(cfg: AgentConfig) -> list[Check]:
    if not cfg.ebpf.enabled:
        return [Check("eBPF uprobes", OFF, "[ebpf] enabled = false")]
    checks: list[Check] = []
    try:
        # Guarded (module docstring): doctor reports a missing piece instead of failing.
        from agent.ebpf.node import ebpf_status
    except ImportError as exc:
        checks.append(
            Check("eBPF uprobes", UNAVAILABLE, f"the eBPF collector is not installed ({exc})")
        )
    else:
        try:
            ok, why = ebpf_status()
        except Exception as exc:
            ok, why = False, f"check failed: {exc!r}"
        checks.append(Check("eBPF uprobes", OK if ok else UNAVAILABLE, why))
    checks.append(_libraries_check(cfg))
    return checks


def _libraries_check(cfg: AgentConfig) -> Check:
    """libcuda/libnccl: on the node (ldconfig cache) and mapped in running processes."""
    found: dict[str, set[str]] = {"libcuda": set(), "libnccl": set()}
    ldconfig = Path("/etc/ld.so.cache")
    try:
        cache = ldconfig.read_bytes()
    except OSError:
        cache = b""
    for name in found:
        if f"{name}.so".encode() in cache:
            found[name].add("ld.so.cache")
    proc = Path(cfg.paths.proc_root)
    mapped = {"libcuda": 0, "libnccl": 0}
    try:
        pids = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        pids = []
    for pid in pids:
        try:
            maps = (proc / pid / "maps").read_bytes()
        except OSError:
            continue
        for name in mapped:
            if f"/{name}.so".encode() in maps or f"/{name}".encode() + b"." in maps:
                mapped[name] += 1
    parts = []
    for name in found:
        where = "installed" if found[name] else "not in ld.so.cache"
        parts.append(f"{name}: {where}, mapped by {mapped[name]} process(es)")
    status = OK if found["libcuda"] or mapped["libcuda"] else UNAVAILABLE
    detail = "; ".join(parts)
    if status == UNAVAILABLE:
        detail += " — no CUDA driver library on this node: nothing to probe"
    return Check("libcuda/libnccl", status, detail)


def check_kmsg(cfg: AgentConfig) -> Check:
    path = cfg.paths.kmsg
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return Check("kernel log", UNAVAILABLE, f"{path} does not exist")
    except PermissionError:
        return Check(
            "kernel log", UNAVAILABLE, f"{path}: permission denied — run the agent as root"
        )
    except OSError as exc:
        return Check("kernel log", UNAVAILABLE, f"{path}: {exc.strerror}")
    os.close(fd)
    return Check("kernel log", OK, f"{path} readable (NVRM Xid lines)")


def check_infiniband(cfg: AgentConfig) -> Check:
    base = Path(cfg.paths.sys_root) / "class" / "infiniband"
    try:
        devices = sorted(p.name for p in base.iterdir())
    except OSError:
        return Check("InfiniBand/RoCE", UNAVAILABLE, f"no {base} — no InfiniBand/RoCE devices")
    if not devices:
        return Check("InfiniBand/RoCE", UNAVAILABLE, f"{base} is empty — no devices")
    ports = sum(len(list((base / d / "ports").glob("*"))) for d in devices)
    return Check(
        "InfiniBand/RoCE", OK, f"{len(devices)} device(s) ({', '.join(devices)}), {ports} port(s)"
    )


def check_mountstats(cfg: AgentConfig) -> Check:
    path = Path(cfg.paths.mountstats)
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return Check("storage (mountstats)", UNAVAILABLE, f"{path}: {exc.strerror}")
    nfs = sum(
        1 for line in text.splitlines() if line.startswith("device ") and " with fstype nfs" in line
    )
    disk = Path(cfg.paths.diskstats)
    disk_note = "diskstats readable" if os.access(disk, os.R_OK) else f"{disk} not readable"
    return Check("storage (mountstats)", OK, f"{path}: {nfs} NFS mount(s); {disk_note}")


def check_dead_letter(cfg: AgentConfig) -> Check:
    """Batches ingest refused (agent/spool.py `DeadLetter`): kept with their reason, never
    resent. Read without creating anything: doctor must not make the agent's directories."""
    directory = Path(cfg.spool.dir) / DEAD_LETTER_DIR
    source = "dead letter (refused batches)"
    if not directory.is_dir():
        return Check(source, OK, f"{directory}: none")
    try:
        dead = DeadLetter(directory)
        entries = dead.entries()
    except OSError as exc:
        return Check(source, UNAVAILABLE, f"{directory}: {exc.strerror or exc}")
    if not entries:
        return Check(source, OK, f"{directory}: none")
    newest = entries[-1]
    trace = newest.get("trace_file") or newest.get("batch_file") or "?"
    dropped = f", {dead.dropped} older one(s) dropped at the cap" if dead.dropped else ""
    return Check(
        source,
        ATTENTION,
        f"{directory}: {len(entries)} batch(es) refused by ingest{dropped}; newest "
        f"#{newest.get('sequence')}: {newest.get('reason', '?')} — inspect with "
        f"`proof-agent validate {directory / trace}`",
    )


def check_slurm(cfg: AgentConfig, which: Callable[[str], str | None] = shutil.which) -> Check:
    if not cfg.slurm.enabled:
        return Check("Slurm", OFF, "[slurm] enabled = false")
    have = [c for c in ("scontrol", "sacct") if which(c)]
    if not have:
        return Check(
            "Slurm",
            UNAVAILABLE,
            "scontrol/sacct not on PATH — not a Slurm node (job ids still come from SLURM_* in process environments)",
        )
    return Check("Slurm", OK, f"{', '.join(have)} found")


def check_kubernetes(cfg: AgentConfig, timeout: float) -> Check:
    """The kubelet's PodResources API (GPU → pod) and where pod labels/owners come from."""
    k = cfg.kubernetes
    if not k.enabled:
        return Check("Kubernetes", OFF, "[kubernetes] enabled = false")
    ok, why = socket_readable(k.pod_resources_socket)
    if not ok:
        return Check("Kubernetes", UNAVAILABLE, f"{why} — not a Kubernetes node, or not mounted")
    client = PodResourcesClient(k.pod_resources_socket, timeout_s=timeout)
    try:
        gpus = client.allocatable_gpus()
        held = client.list_gpus()
    except Exception as exc:  # grpc.RpcError: a kubelet that does not answer
        return Check("Kubernetes", UNAVAILABLE, f"PodResources at {why}: {_reason(exc)}")
    finally:
        client.close()
    collector = kubernetes_collector(cfg, lambda _index: None)
    collector.pods.refresh(0.0, force=True)
    source = collector.pods.source_used or "none answered (pods are keyed by their uid only)"
    return Check(
        "Kubernetes",
        OK,
        f"{len(gpus)} allocatable GPU(s), {len(held)} container(s) holding GPUs; "
        f"pod metadata from: {source}",
    )


def check_inference(cfg: AgentConfig, timeout: float) -> Check:
    urls = list(cfg.inference.endpoints)
    discovered: list[str] = []
    if cfg.inference.discover:
        try:
            # Guarded (module docstring): doctor reports a missing piece instead of failing.
            from agent.collectors.inference import discover

            servers = discover(cfg.paths.proc_root)
            discovered = [f"{s.server} {s.url}" for s in servers]
            urls += [s.url for s in servers]
        except ImportError:
            pass
    if not urls:
        return Check(
            "inference servers", UNAVAILABLE, "none configured or running (vLLM/SGLang/TGI)"
        )
    bad = []
    for url in dict.fromkeys(urls):
        try:
            with open_http(url, timeout) as resp:
                resp.read(1024)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            bad.append(f"{url}: {_reason(exc)}")
    ok = len(set(urls)) - len(bad)
    detail = f"{ok} of {len(set(urls))} endpoint(s) answer"
    if discovered:
        detail += f" (discovered: {'; '.join(discovered)})"
    if bad:
        detail += " — " + "; ".join(bad)
    return Check("inference servers", OK if ok else UNAVAILABLE, detail)


def check_server(cfg: AgentConfig, timeout: float) -> Check:
    address = cfg.server.address
    if not address:
        return Check("ingest server", OFF, "[server] address not set — records stay local")
    try:
        token = cfg.resolved_token()
    except ConfigError as exc:
        return Check("ingest server", UNAVAILABLE, str(exc))
    if not token:
        return Check("ingest server", UNAVAILABLE, "no token: set [server] token_file (or token)")
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]")
    try:
        sock = socket.create_connection((host, int(port_text)), timeout=timeout)
    except (OSError, ValueError) as exc:
        return Check("ingest server", UNAVAILABLE, f"{address}: {_reason(exc)}")
    tls_note = "plaintext"
    try:
        if cfg.server.tls:
            ctx = ssl.create_default_context(cafile=cfg.server.ca_file or None)
            if cfg.server.cert_file:
                ctx.load_cert_chain(cfg.server.cert_file, cfg.server.key_file)
            ctx.set_alpn_protocols(["h2"])
            with ctx.wrap_socket(sock, server_hostname=host) as tls:
                tls_note = f"TLS ok ({tls.version()})"
        else:
            sock.close()
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        return Check("ingest server", UNAVAILABLE, f"{address}: TLS failed: {_reason(exc)}")
    # The transport, when present, can prove the token with a real Register call.
    verify = None
    try:
        # Guarded (module docstring): doctor reports a missing piece instead of failing.
        from agent import transport

        verify = getattr(transport, "check_server", None)
    except ImportError:
        pass
    if verify is not None:
        try:
            verify(cfg, timeout=timeout)
        except Exception as exc:
            code = getattr(exc, "code", None)
            name = getattr(code() if callable(code) else None, "name", "")
            details = getattr(exc, "details", None)
            why = details() if callable(details) else str(exc)
            if isinstance(exc, PermissionError) or name in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
                return Check(
                    "ingest server",
                    UNAVAILABLE,
                    f"{address} reachable, {tls_note}; token refused: {why}",
                )
            return Check(
                "ingest server",
                UNAVAILABLE,
                f"{address} reachable, {tls_note}; but the Register call failed"
                f"{f' ({name})' if name else ''}: {why}",
            )
        return Check("ingest server", OK, f"{address} reachable, {tls_note}, token accepted")
    return Check(
        "ingest server", OK, f"{address} reachable, {tls_note}; token present (not verified)"
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        return _reason(exc.reason) if isinstance(exc.reason, BaseException) else str(exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or exc.__class__.__name__


def run_checks(cfg: AgentConfig, timeout: float = 2.0) -> list[Check]:
    checks: list[Check] = []
    steps: list[Callable[[], Check | list[Check]]] = [
        lambda: check_nvml(cfg),
        lambda: check_dcgm_bindings(cfg),
        lambda: check_dcgm_exporter(cfg, timeout),
        lambda: check_ebpf(cfg),
        lambda: check_kmsg(cfg),
        lambda: check_infiniband(cfg),
        lambda: check_mountstats(cfg),
        lambda: check_slurm(cfg),
        lambda: check_kubernetes(cfg, timeout),
        lambda: check_inference(cfg, timeout),
        lambda: check_server(cfg, timeout),
        lambda: check_dead_letter(cfg),
    ]
    for step in steps:
        try:
            result = step()
        except Exception as exc:  # a check must never stop the others
            result = Check(
                getattr(step, "__name__", "check"), UNAVAILABLE, f"check crashed: {exc!r}"
            )
        checks.extend(result if isinstance(result, list) else [result])
    return checks


def run(args: argparse.Namespace) -> int:
    # The collectors log why a source is unavailable; here that is the report itself.
    logging.getLogger("agent").setLevel(logging.ERROR)
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"proof-agent doctor: {exc}", file=sys.stderr)
        return 2
    checks = run_checks(cfg, args.timeout)
    if args.json:
        print(json.dumps({"config": cfg.source, "checks": [asdict(c) for c in checks]}, indent=2))
        return 0
    print(f"proof-agent doctor — config: {cfg.source}")
    width = max(len(c.source) for c in checks)
    for c in checks:
        print(f"  {c.source:<{width}}  {c.status:<11}  {c.detail}")
    usable = sum(1 for c in checks if c.status == OK)
    print(f"{usable} of {len(checks)} sources usable on this node")
    return 0
