"""The agent's one config file (TOML), with environment overrides.

    proof-agent run --config /etc/proof-agent/proof-agent.toml

Every option is a field below, with its default and its meaning; packaging/proof-agent.toml
is the commented example (a test checks it lists every option). Any option can be overridden
from the environment as `PROOF_AGENT_<SECTION>_<KEY>` (e.g. `PROOF_AGENT_SERVER_TOKEN`,
`PROOF_AGENT_DCGM_MODE=off`); lists are comma-separated there. The file is looked for at
`--config`, else `$PROOF_AGENT_CONFIG`, else /etc/proof-agent/proof-agent.toml (a missing default
file means all defaults). Unknown sections/keys and wrongly typed values are errors that name
the key, the value and the file.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

DEFAULT_PATH = "/etc/proof-agent/proof-agent.toml"
ENV_PATH = "PROOF_AGENT_CONFIG"
ENV_PREFIX = "PROOF_AGENT_"
DCGM_MODES = ("bindings", "exporter", "off")
EBPF_PROBE_GROUPS = ("launch", "sync", "memcpy", "nccl", "graph", "mem")  # ebpf.calls.PROBE_GROUPS
# The [paths] defaults that live under /proc: they follow a relocated proc_root.
DEFAULT_PATHS = {"mountstats": "/proc/self/mountstats", "diskstats": "/proc/diskstats"}


class ConfigError(ValueError):
    """The config is wrong; the message names the key, the value and where it came from."""


def _opt(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass
class AgentSection:
    node: str = _opt("", "node name on every record; empty = this machine's hostname")
    interval_s: float = _opt(1.0, "collection interval in seconds (the GPU vocabulary is 1 Hz)")
    log_level: str = _opt("info", "debug, info, warning or error")
    metrics_address: str = _opt(
        "",
        "serve the agent's own Prometheus /metrics on host:port (':9464' = all interfaces); empty = off",
    )


@dataclass
class ServerSection:
    address: str = _opt("", "ingest server host:port; empty = record locally only")
    token: str = _opt("", "agent token (prefer token_file: the config may be world-readable)")
    token_file: str = _opt("", "file holding the agent token (read at start)")
    tls: bool = _opt(True, "use TLS to the ingest server")
    ca_file: str = _opt("", "CA bundle to verify the server; empty = system roots")
    cert_file: str = _opt("", "client certificate for mutual TLS (optional)")
    key_file: str = _opt("", "client key for mutual TLS (optional)")


@dataclass
class SpoolSection:
    dir: str = _opt("/var/lib/proof-agent/spool", "on-disk spool of unacknowledged batches")
    max_mib: int = _opt(2048, "spool size cap; past it the oldest data is dropped and counted")


@dataclass
class PathsSection:
    proc_root: str = _opt("/proc", "procfs root (a container sees the host's at /host/proc)")
    sys_root: str = _opt("/sys", "sysfs root (InfiniBand counters under class/infiniband)")
    kmsg: str = _opt("/dev/kmsg", "kernel log device, for NVRM Xid lines")
    mountstats: str = _opt("/proc/self/mountstats", "NFS statistics per mount")
    diskstats: str = _opt("/proc/diskstats", "block device statistics")


@dataclass
class NvmlSection:
    enabled: bool = _opt(True, "read GPUs through NVML (nvidia-ml-py)")


@dataclass
class DcgmSection:
    mode: str = _opt(
        "bindings",
        "profiling fields from: bindings (DCGM's Python bindings + nv-hostengine), "
        "exporter (scrape a dcgm-exporter /metrics URL) or off",
    )
    bindings_path: str = _opt(
        "/usr/local/dcgm/bindings/python3", "where DCGM installed its Python bindings"
    )
    host: str = _opt("127.0.0.1", "nv-hostengine address, or 'embedded' (in-process, root)")
    exporter_url: str = _opt("http://127.0.0.1:9400/metrics", "dcgm-exporter endpoint")


@dataclass
class EbpfSection:
    enabled: bool = _opt(True, "uprobes on libcuda/libnccl (needs root and bcc)")
    probe_groups: list[str] = field(
        default_factory=list,
        metadata={
            "doc": "which call groups to probe: launch, sync, memcpy, nccl, graph, mem; empty = all"
        },
    )
    capture_output: bool = _opt(
        True, "also capture what GPU processes write to stdout/stderr (fd 1/2) through eBPF"
    )


@dataclass
class LogsSection:
    globs: list[str] = field(
        default_factory=list,
        metadata={"doc": "job log files to tail, e.g. ['/scratch/*/logs/*.out']"},
    )
    slurm_output: bool = _opt(True, "also tail each Slurm job's StdOut/StdErr paths")


@dataclass
class InferenceSection:
    discover: bool = _opt(True, "find vLLM/SGLang/TGI servers from process command lines")
    endpoints: list[str] = field(
        default_factory=list, metadata={"doc": "extra /metrics URLs of inference servers to scrape"}
    )


@dataclass
class SlurmSection:
    enabled: bool = _opt(True, "ask scontrol/sacct about jobs when they are installed")


@dataclass
class KubernetesSection:
    enabled: bool = _opt(
        True, "GPU -> pod/namespace/container from the kubelet (a node without one logs it once)"
    )
    pod_resources_socket: str = _opt(
        "/var/lib/kubelet/pod-resources/kubelet.sock", "the kubelet's PodResources API socket"
    )
    pods_url: str = _opt(
        "",
        "PodList URL for pod labels/owners, e.g. https://kubernetes.default.svc/api/v1/pods?fieldSelector=spec.nodeName=NODE "
        "or http://127.0.0.1:10255/pods; empty = pod log directories only",
    )
    token_file: str = _opt("", "bearer token for pods_url (the service-account token)")
    ca_file: str = _opt("", "CA bundle for an https pods_url; empty = system roots")
    pod_log_dir: str = _opt("/var/log/pods", "the kubelet's pod log directories (names and uids)")
    refresh_s: float = _opt(10.0, "how often to re-read PodResources and the pod list")


@dataclass
class AgentConfig:
    agent: AgentSection = field(default_factory=AgentSection)
    server: ServerSection = field(default_factory=ServerSection)
    spool: SpoolSection = field(default_factory=SpoolSection)
    paths: PathsSection = field(default_factory=PathsSection)
    nvml: NvmlSection = field(default_factory=NvmlSection)
    dcgm: DcgmSection = field(default_factory=DcgmSection)
    ebpf: EbpfSection = field(default_factory=EbpfSection)
    logs: LogsSection = field(default_factory=LogsSection)
    inference: InferenceSection = field(default_factory=InferenceSection)
    slurm: SlurmSection = field(default_factory=SlurmSection)
    kubernetes: KubernetesSection = field(default_factory=KubernetesSection)
    source: str = "defaults"  # where it was read from, for messages

    def resolved_token(self) -> str:
        """The agent token: `server.token`, else the contents of `server.token_file`."""
        if self.server.token:
            return self.server.token
        if self.server.token_file:
            try:
                return Path(self.server.token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"{self.source}: [server] token_file {self.server.token_file!r} "
                    f"cannot be read: {exc.strerror}"
                ) from exc
        return ""


def schema() -> dict[str, dict[str, tuple[type, Any, str]]]:
    """section → key → (type, default, doc), for the example file, docs and validation."""
    out: dict[str, dict[str, tuple[type, Any, str]]] = {}
    for sec in fields(AgentConfig):
        if sec.name == "source":
            continue
        cls = sec.default_factory
        if not (isinstance(cls, type) and is_dataclass(cls)):
            raise TypeError(f"config section [{sec.name}] is not a dataclass")
        hints = get_type_hints(cls)
        keys: dict[str, tuple[type, Any, str]] = {}
        for f in fields(cls):
            if f.default is not MISSING:
                default = f.default
            elif f.default_factory is not MISSING:
                default = f.default_factory()
            else:
                raise TypeError(f"config key {sec.name}.{f.name} has no default")
            keys[f.name] = (hints[f.name], default, f.metadata["doc"])
        out[sec.name] = keys
    return out


def _suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# A numeric setting's type → the values a TOML document may give for it, and what the error
# calls it (an integer setting refuses 1.5; a number setting takes 3 as 3.0).
_NUMBERS: dict[type, tuple[type | tuple[type, ...], str]] = {
    int: (int, "an integer"),
    float: ((int, float), "a number"),
}


def _coerce(value: Any, typ: Any, where: str, *, from_env: bool) -> Any:
    if typ is bool:
        if isinstance(value, bool):
            return value
        if from_env and isinstance(value, str):
            low = value.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if typ in _NUMBERS:
        accepted, what = _NUMBERS[typ]
        if isinstance(value, accepted) and not isinstance(value, bool):
            return typ(value)
        if from_env and isinstance(value, str):
            try:
                return typ(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{where} must be {what}, got {value!r}")
    if typ is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where} must be a string, got {value!r}")
    # list[str]
    if from_env and isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(f"{where} must be a list of strings, got {value!r}")


def parse_config(
    data: Mapping[str, Any], *, source: str = "config", env: Mapping[str, str] | None = None
) -> AgentConfig:
    """Validate a decoded TOML document (and env overrides) into an AgentConfig."""
    sch = schema()
    cfg = AgentConfig(source=source)
    for section, body in data.items():
        if section not in sch:
            raise ConfigError(
                f"{source}: unknown section [{section}]{_suggest(section, list(sch))}"
            )
        if not isinstance(body, Mapping):
            raise ConfigError(f"{source}: [{section}] must be a table, got {body!r}")
        target = getattr(cfg, section)
        for key, value in body.items():
            if key not in sch[section]:
                raise ConfigError(
                    f"{source}: unknown key [{section}] {key}{_suggest(key, list(sch[section]))}"
                )
            typ = sch[section][key][0]
            where = f"{source}: [{section}] {key}"
            setattr(target, key, _coerce(value, typ, where, from_env=False))
    for name, value in (env or {}).items():
        if not name.startswith(ENV_PREFIX) or name == ENV_PATH:
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        for section in sch:
            if rest.startswith(section + "_") and rest[len(section) + 1 :] in sch[section]:
                key = rest[len(section) + 1 :]
                typ = sch[section][key][0]
                where = f"environment {name}"
                setattr(getattr(cfg, section), key, _coerce(value, typ, where, from_env=True))
                break
        else:
            raise ConfigError(f"environment {name}: no such option (PROOF_AGENT_<SECTION>_<KEY>)")
    _check(cfg)
    return cfg


def _check(cfg: AgentConfig) -> None:
    src = cfg.source
    if cfg.dcgm.mode not in DCGM_MODES:
        raise ConfigError(
            f"{src}: [dcgm] mode must be one of {', '.join(DCGM_MODES)}, got {cfg.dcgm.mode!r}"
        )
    if not cfg.agent.interval_s > 0:
        raise ConfigError(f"{src}: [agent] interval_s must be > 0, got {cfg.agent.interval_s!r}")
    for group in cfg.ebpf.probe_groups:
        if group not in EBPF_PROBE_GROUPS:
            raise ConfigError(
                f"{src}: [ebpf] probe_groups: unknown group {group!r} "
                f"(one of {', '.join(EBPF_PROBE_GROUPS)})"
            )
    if cfg.spool.max_mib <= 0:
        raise ConfigError(f"{src}: [spool] max_mib must be > 0, got {cfg.spool.max_mib!r}")
    if cfg.agent.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(
            f"{src}: [agent] log_level must be debug, info, warning or error, "
            f"got {cfg.agent.log_level!r}"
        )
    if cfg.server.address and ":" not in cfg.server.address:
        raise ConfigError(f"{src}: [server] address must be host:port, got {cfg.server.address!r}")
    if bool(cfg.server.cert_file) != bool(cfg.server.key_file):
        raise ConfigError(f"{src}: [server] cert_file and key_file must be set together")


def load_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> AgentConfig:
    """Read the config file (see module docstring for where) and apply env overrides."""
    env = os.environ if env is None else env
    explicit = path is not None or bool(env.get(ENV_PATH))
    chosen = Path(path if path is not None else env.get(ENV_PATH) or DEFAULT_PATH)
    try:
        raw = chosen.read_bytes()
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"config file {chosen} does not exist") from None
        return parse_config({}, source="defaults", env=env)
    except OSError as exc:
        raise ConfigError(f"config file {chosen} cannot be read: {exc.strerror}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{chosen}: not valid TOML: {exc}") from exc
    return parse_config(data, source=str(chosen), env=env)
