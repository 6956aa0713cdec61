"""A tiny stand-in libcuda/libnccl and a program that calls them, for the eBPF probes.

The real libraries need a GPU; the probes only need the symbols. `build(dest)` compiles, with
the system C compiler, `libcuda.so.1` and `libnccl.so.2` (the entry points agent/ebpf probes,
with their real signatures) and `driver`, which calls them at the counts, durations and gaps
it is told on stdin. The eBPF tests assert what the probes read back against those known
figures; `proof-agent bench --ebpf` times calls with and without the probes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

SOURCES = ("fake_common.h", "fake_cuda.c", "fake_nccl.c", "driver.c")


class BuildError(RuntimeError):
    """No C compiler, or the sources did not compile."""


@dataclass(frozen=True)
class Built:
    libdir: Path  # holds libcuda.so.1 and libnccl.so.2
    driver: Path

    @property
    def libcuda(self) -> Path:
        return self.libdir / "libcuda.so.1"

    @property
    def libnccl(self) -> Path:
        return self.libdir / "libnccl.so.2"


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(dest: Path, library_opt: str = "-O2") -> Built:
    """Compile the stand-in libraries and the driver into `dest` (created if missing).

    `library_opt` is the libraries' optimization flag. It decides the probed functions' first
    instruction, which decides a uprobe's cost: at -O2 (gcc, x86-64) it is a RIP-relative load
    the kernel must single-step out of line; at -O0 it is `push %rbp`, which the kernel
    emulates without the single-step trap."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler (cc/gcc) on PATH; install gcc")
    dest.mkdir(parents=True, exist_ok=True)
    src = dest / "src"
    src.mkdir(exist_ok=True)
    package = resources.files(__name__)
    for name in SOURCES:
        (src / name).write_text(package.joinpath(name).read_text(encoding="utf-8"))
    built = Built(libdir=dest, driver=dest / "driver")
    steps = [
        [cc, library_opt, "-shared", "-fPIC", "-o", str(built.libcuda), str(src / "fake_cuda.c")],
        [cc, library_opt, "-shared", "-fPIC", "-o", str(built.libnccl), str(src / "fake_nccl.c")],
        [cc, "-O2", "-o", str(built.driver), str(src / "driver.c"), "-ldl", "-lpthread"],
    ]
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True, check=False)  # noqa: S603 - the C compiler found on PATH, compiling our bundled sources
        if result.returncode != 0:
            raise BuildError(f"{' '.join(step)} failed:\n{result.stderr}")
    return built


class Driver:
    """The driver program running: send it commands, wait for each to finish."""

    def __init__(self, built: Built, *, stderr: int | None = subprocess.DEVNULL) -> None:
        self.process = subprocess.Popen(  # noqa: S603 - the driver program we just built
            [str(built.driver), str(built.libdir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            bufsize=1,
        )
        ready = self._read_line()
        if not ready.startswith("ready "):
            self.close()
            raise BuildError(f"driver did not start: {ready!r}")
        self.pid = int(ready.split()[1])

    def _read_line(self) -> str:
        if self.process.stdout is None:  # cannot be: opened as PIPE
            raise RuntimeError("the driver's stdout is not a pipe")
        line = self.process.stdout.readline()
        if not line:
            raise BuildError(f"driver exited (status {self.process.poll()})")
        return line.strip()

    def command(self, line: str) -> str:
        """Run one command; returns what follows "ok" in the answer."""
        self.send(line)
        return self.wait(line)

    def send(self, line: str) -> None:
        """Start one command without waiting for it (then `wait()`)."""
        if self.process.stdin is None:  # cannot be: opened as PIPE
            raise RuntimeError("the driver's stdin is not a pipe")
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def wait(self, line: str = "the command") -> str:
        """Wait for the answer to the command sent last."""
        answer = self._read_line()
        if not answer.startswith("ok"):
            raise BuildError(f"driver refused {line!r}: {answer}")
        return answer[2:].strip()

    def close(self, timeout: float = 5.0) -> int:
        if self.process.poll() is None:
            try:
                if self.process.stdin is None:  # cannot be: opened as PIPE
                    raise RuntimeError("the driver's stdin is not a pipe")
                self.process.stdin.write("exit\n")
                self.process.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
