"""Options and assembly shared by `proof-agent run` and `proof-agent record`: which backend the
collectors read (the simulated fleet, or this node's real sources), on which clock."""

from __future__ import annotations

import argparse
import logging
import signal
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from agent.config import ConfigError, load_config
from agent.runtime import AcceleratedClock, Agent, AgentStats, Clock, Collector, Sink, SystemClock

log = logging.getLogger(__name__)


class BackendError(Exception):
    """The requested backend cannot run here; the message says why."""


def parse_speed(text: str) -> float:
    if text in ("max", "0"):
        return 0.0
    try:
        speed = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"speed must be a number or 'max', got {text!r}") from None
    if speed <= 0:
        raise argparse.ArgumentTypeError("speed must be > 0 (or 'max': no waiting)")
    return speed


def add_backend_arguments(parser: argparse.ArgumentParser, *, default_duration: float) -> None:
    parser.add_argument(
        "--backend",
        choices=("node", "sim"),
        default=None,
        help="where the collectors read from: 'node' (the default) = this node's GPUs, kernel, "
        "fabric, storage and job logs as --config enables them; 'sim' = the simulated fleet "
        "(the default when --scenario is given)",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="agent config file (--backend node; default $PROOF_AGENT_CONFIG, else "
        "/etc/proof-agent/proof-agent.toml)",
    )
    parser.add_argument("--scenario", default=None, help="simulator scenario (--backend sim)")
    parser.add_argument("--seed", type=int, default=1, help="simulator seed (default 1)")
    parser.set_defaults(default_duration=default_duration)
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help=f"simulated seconds to run (default {default_duration:g}; --backend node: "
        "run until stopped unless given)",
    )
    parser.add_argument(
        "--speed",
        type=parse_speed,
        default=1.0,
        help="clock speed-up: 60 = a simulated minute per second; 'max' = no waiting",
    )
    parser.add_argument(
        "--node",
        default=None,
        help="--backend sim: play only this simulated node's records (default: every node "
        "through one agent); --backend node: the node name (default [agent] node, else the "
        "hostname)",
    )
    parser.add_argument("--nodes", type=int, default=None, help="simulated nodes")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="simulated GPUs per node")
    parser.add_argument(
        "--start-ts",
        type=float,
        default=None,
        help="simulated start time, seconds since the epoch (default: now at --speed 1; "
        "otherwise now minus --duration, so an accelerated run ends about now)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=None,
        help="collection interval, seconds (default: the config's [agent] interval_s, else 1)",
    )


@dataclass
class Assembled:
    collectors: list[Collector]
    clock: Clock
    node: str | None  # what the identity join stamps on records without a node
    until: float | None  # clock time to stop at (None: until stopped)
    meta: dict[str, Any]
    truth: Any
    interval: float = 1.0
    config: Any = None  # the AgentConfig (--backend node)

    def run_agent(self, sink: Sink, *, metrics_address: str = "") -> AgentStats:
        """The agent loop over these collectors into `sink`, until `until` or SIGINT/SIGTERM
        (which stop it cleanly); the agent is closed and the previous handlers are back after.
        With `metrics_address` (host:port) the agent's own /metrics is served meanwhile."""
        agent = Agent(
            self.collectors, sink, clock=self.clock, interval=self.interval, node=self.node
        )
        metrics = None

        def stop(signum: int, frame: object) -> None:
            agent.stop()

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            if metrics_address:
                # Only when asked: prometheus-client is in the [agent] extra, not the base
                # install. A bad or busy address raises before collection starts.
                from agent.runtime.metrics import serve_metrics

                metrics = serve_metrics(metrics_address, agent, sink)
            return agent.run(until=self.until)
        finally:
            agent.close()
            if metrics is not None:
                metrics.shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def assemble(args: argparse.Namespace) -> Assembled:
    """Build the collectors and clock the command's arguments ask for."""
    if args.backend is None:
        args.backend = "sim" if args.scenario else "node"
    if args.backend == "sim":
        assembled = _assemble_sim(args)
        if args.interval is not None:
            assembled.interval = args.interval
        return assembled
    if args.backend == "node":
        return _assemble_node(args)
    raise BackendError(f"unknown backend {args.backend!r}")


def _assemble_node(
    args: argparse.Namespace, *, clock: Clock | None = None, **inject: Any
) -> Assembled:
    """This node's collectors from the config file (agent.runtime.node_backend).

    `inject` (tests, the bench): `nvml`, `fetch`, `ebpf_status` for NodeBackend.from_config."""
    # Each backend is loaded only when chosen: this one imports every node collector.
    from agent.runtime.node_backend import NodeBackend

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        raise BackendError(str(exc)) from exc
    logging.getLogger("agent").setLevel(cfg.agent.log_level.upper())
    if args.scenario:
        raise BackendError("--scenario is for --backend sim")
    backend = NodeBackend.from_config(cfg, node=args.node, **inject)
    facts = backend.node_facts()
    meta: dict[str, Any] = {
        "backend": "node",
        "node": backend.node,
        "recorded_by": "proof-agent",
        "gpus": facts["gpus"],
        "collectors": backend.names,
    }
    for key in ("driver_version", "cuda_version"):
        if facts.get(key):
            meta[key] = facts[key]
    try:
        meta["agent_version"] = metadata.version("proof")
    except metadata.PackageNotFoundError:  # not installed as a distribution (zipapp)
        log.debug("no installed proof distribution: agent_version left out of the meta")
    log.info(
        "node %s: %d GPUs; collectors %s%s",
        backend.node,
        len(facts["gpus"]),
        ", ".join(backend.names),
        f"; eBPF off: {backend.ebpf_reason}" if backend.ebpf_reason else "",
    )
    clock = clock or SystemClock()
    until = clock.now() + args.duration if args.duration else None
    return Assembled(
        collectors=backend.collectors,
        clock=clock,
        node=backend.node,
        until=until,
        meta=meta,
        truth=None,
        interval=args.interval if args.interval is not None else cfg.agent.interval_s,
        config=cfg,
    )


def _assemble_sim(args: argparse.Namespace) -> Assembled:
    if args.duration is None:
        args.duration = args.default_duration
    if not args.scenario:
        raise BackendError("--backend sim needs --scenario (see `proof simulate --list`)")
    try:
        # Each backend is loaded only when chosen: this one imports the simulator.
        from agent.runtime.sim_backend import SimBackend
    except ImportError as exc:
        raise BackendError(f"the simulator is not available: {exc}") from exc
    if args.start_ts is not None:
        start_ts = float(args.start_ts)
    elif args.speed == 1.0:
        start_ts = float(int(time.time()))  # live: the simulated node runs from now on
    else:
        # Faster than real time the simulated clock would run into the future (which ingest
        # refuses); instead start in the past so that the played run ends about now.
        start_ts = float(int(time.time() - args.duration))
    try:
        backend = SimBackend.from_scenario(
            args.scenario,
            seed=args.seed,
            duration_s=args.duration,
            start_ts=start_ts,
            node=args.node,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
        )
    except KeyError as exc:  # simulator.UnknownScenario
        raise BackendError(str(exc)) from exc
    except ValueError as exc:
        raise BackendError(f"simulator: {exc}") from exc
    meta, truth = backend.trace_meta()
    meta.update(seed=args.seed, recorded_by="proof-agent", speed=args.speed or "max")
    return Assembled(
        collectors=list(backend.collectors()),
        clock=AcceleratedClock(start_ts, args.speed),
        node=args.node,
        until=backend.end_ts,
        meta=meta,
        truth=truth,
    )
