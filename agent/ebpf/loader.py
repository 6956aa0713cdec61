"""Compile and load probes.c in a short-lived child process; hand the agent the fds.

bcc's LLVM costs ~64 MiB of RSS to import and ~135 MiB after a compile, which would stay in
the long-running agent. Instead `load_in_child()` runs this module as a child process that
imports bcc, compiles and loads the program, and sends the loaded programs' and maps' file
descriptors back over a Unix socket (SCM_RIGHTS); the child then exits, and the kernel objects
live on through the agent's descriptors. The agent reads the maps and attaches probes with
plain syscalls (agent.ebpf.bpfsys).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import ClassVar, Generic, Protocol, Self, TypeVar

from agent.ebpf._bcc import import_bcc, load_failure_hints
from agent.ebpf.calls import PROBES, cflags

MAP_NAMES: tuple[str, ...] = (
    "stats",
    "control",
    "last_launch",
    "inflight",
    "group_state",
    "hist_control",
    "hist",
    "colls",
)
PROGRAM_NAMES: tuple[str, ...] = tuple(
    sorted({f for probes in PROBES.values() for p in probes for f in (p.entry, p.exit) if f})
)
WRITE_PROGRAM = "tracepoint__syscalls__sys_enter_write"  # what TRACEPOINT_PROBE names it


@dataclass(frozen=True)
class ProgramSpec:
    """A BPF C file of this package, the functions to load from it and the maps to hand on."""

    source: str
    programs: tuple[tuple[str, str], ...]  # (function, "kprobe" | "tracepoint")
    maps: tuple[str, ...]


SPECS: dict[str, ProgramSpec] = {
    "probes": ProgramSpec("probes.c", tuple((n, "kprobe") for n in PROGRAM_NAMES), MAP_NAMES),
    "writes": ProgramSpec(
        "writes.c", ((WRITE_PROGRAM, "tracepoint"),), ("tracked", "events", "dropped")
    ),
}
_MAX_MESSAGE = 1 << 16

_Program = TypeVar("_Program")


def load_or_explain(
    load: Callable[[], _Program], log: logging.Logger, what: str
) -> tuple[_Program | None, str | None]:
    """(the loaded program, None), or (None, why not) with the reason logged once as `what`
    being disabled: a node where BPF cannot load keeps its agent running without it."""
    try:
        return load(), None
    except Exception as error:  # the loader says why (compile error, privileges, …)
        reason = f"BPF programs cannot be loaded: {error}"
        log.warning("%s disabled: %s", what, reason)
        return None, reason


class _Closable(Protocol):
    def close(self) -> None: ...


_Loaded = TypeVar("_Loaded", bound=_Closable)


class LoadsOnce(Generic[_Loaded]):
    """A collector whose BPF program `_load()` loads at the first `start()` and keeps until
    `close()`; a program that cannot load leaves the collector unavailable, saying why (the
    reason is logged once, by the subclass's module logger, as `what` being disabled)."""

    what: ClassVar[str]

    def __init__(self) -> None:
        self.available: bool | None = None  # None until the first start attempt
        self.unavailable_reason: str | None = None
        self._bpf: _Loaded | None = None

    def _load(self) -> _Loaded:
        raise NotImplementedError

    def start(self) -> bool:
        """Compile and load the BPF program. False (with `unavailable_reason`) if it cannot."""
        if self.available is not None:
            return self.available
        self._bpf, self.unavailable_reason = load_or_explain(
            self._load, logging.getLogger(type(self).__module__), self.what
        )
        self.available = self._bpf is not None
        return self.available

    def close(self) -> None:
        """Free the program; the next `start()` loads it again."""
        if self._bpf is not None:
            self._bpf.close()
            self._bpf = None
        self.available = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def probes_source() -> str:
    """The BPF C program (package data, so it also works from a zipapp)."""
    return resources.files("agent.ebpf").joinpath("probes.c").read_text(encoding="utf-8")


@dataclass
class LoadedProgram:
    """The probe programs and maps, as file descriptors this process owns."""

    programs: dict[str, int] = field(default_factory=dict)
    maps: dict[str, int] = field(default_factory=dict)

    def close(self) -> None:
        for fd in [*self.programs.values(), *self.maps.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.programs.clear()
        self.maps.clear()


def load_in_child(
    spec: str = "probes", extra_cflags: list[str] | None = None, timeout_s: float = 180.0
) -> LoadedProgram:
    """Compile and load SPECS[spec] in a child process; raises RuntimeError saying why not."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = dict(os.environ)
    # The child must import this package however the agent was started (venv, zipapp).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        child = subprocess.Popen(  # noqa: S603 - our interpreter running our own loader module
            [
                sys.executable,
                "-m",
                "agent.ebpf.loader",
                str(theirs.fileno()),
                spec,
                json.dumps(extra_cflags or []),
            ],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
    finally:
        theirs.close()
    fds: list[int] = []
    try:
        ours.settimeout(timeout_s)
        message, fds, _flags, _address = socket.recv_fds(ours, _MAX_MESSAGE, 64)
        _out, err = child.communicate(timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as error:
        child.kill()
        child.wait()
        for fd in fds:
            os.close(fd)
        raise RuntimeError(f"the BPF loader process failed: {error}") from error
    finally:
        ours.close()
    stderr_tail = " | ".join(err.decode("utf-8", "replace").strip().splitlines()[-3:])
    try:
        meta = json.loads(message.decode()) if message else {}
    except ValueError:
        meta = {}
    if "error" in meta or child.returncode != 0 or not meta:
        for fd in fds:
            os.close(fd)
        reason = meta.get("error") or f"loader exited with status {child.returncode}"
        raise RuntimeError(f"{reason}" + (f" [{stderr_tail}]" if stderr_tail else ""))
    names = meta["programs"] + meta["maps"]
    if len(names) != len(fds):
        for fd in fds:
            os.close(fd)
        raise RuntimeError(f"the BPF loader sent {len(fds)} descriptors for {len(names)} names")
    loaded = LoadedProgram()
    for name, fd in zip(meta["programs"], fds, strict=False):
        loaded.programs[name] = fd
    for name, fd in zip(meta["maps"], fds[len(meta["programs"]) :], strict=True):
        loaded.maps[name] = fd
    return loaded


def _child_main(sock_fd: int, spec_name: str, extra_cflags: list[str]) -> int:
    sock = socket.socket(fileno=sock_fd)
    try:
        try:
            spec = SPECS[spec_name]
            bcc = import_bcc()
            source = resources.files("agent.ebpf").joinpath(spec.source).read_text("utf-8")
            flags = (cflags() if spec_name == "probes" else []) + extra_cflags
            bpf = bcc.BPF(text=source.encode(), cflags=flags)
            kinds = {"kprobe": bcc.BPF.KPROBE, "tracepoint": bcc.BPF.TRACEPOINT}
            programs = {n: bpf.load_func(n.encode(), kinds[k]).fd for n, k in spec.programs}
            maps = {n: bpf[n.encode()].map_fd for n in spec.maps}
        except Exception as error:
            hints = load_failure_hints()
            reason = f"{error}" + (f" ({hints})" if hints else "")
            sock.sendall(json.dumps({"error": reason}).encode())
            return 1
        meta = {"programs": list(programs), "maps": list(maps)}
        socket.send_fds(sock, [json.dumps(meta).encode()], [*programs.values(), *maps.values()])
        return 0
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(_child_main(int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])))
