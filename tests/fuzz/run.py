"""Run the fuzz targets of tests/fuzz/targets.py for a bounded time each.

    python -m tests.fuzz.run [--seconds 8] [--corpus DIR] [--artifacts DIR] [TARGET ...]

Each target runs in a process of its own under atheris (coverage-guided libFuzzer, the modules
under test instrumented), seeded from the real fixtures (`targets.seeds`), for `--seconds`
seconds. Without atheris (it ships wheels for CPython on Linux x86_64 and macOS only) the same
target runs under a pure-Python mutator over the same seeds instead, and says so.

A crash — any exception other than the refusals the target allows — stops that target: the
input is kept in `--artifacts` (`crash-<sha1>`), the traceback printed, and the exit status is 1.
Exit 0 when every target ran its time without one. CI runs `--seconds 8` for each of the three
targets (tests/fuzz/test_fuzz.py); longer runs: docs/scaling.md ("Fuzzing").
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The modules each target exercises: what atheris instruments for coverage feedback.
INSTRUMENT = {
    "batch": ("contract.wire", "ingest.processing"),
    "trace": ("contract.trace", "contract.limits"),
    "parsers": ("contract.parsers",),
}


def _atheris() -> Any:
    """The atheris module, or None where it is not installed. Imported by name: it is an
    optional dependency (the dev extra, Linux x86_64 only) and ships no type information."""
    try:
        return importlib.import_module("atheris")
    except ImportError:
        return None


def _have_atheris() -> bool:
    return _atheris() is not None


def _write_seeds(name: str, corpus: Path) -> int:
    from tests.fuzz.targets import seeds

    corpus.mkdir(parents=True, exist_ok=True)
    count = 0
    for data in seeds(name):
        (corpus / f"seed-{hashlib.sha1(data).hexdigest()}").write_bytes(data)  # noqa: S324 - a file name, not security
        count += 1
    return count


def _keep(artifacts: Path, data: bytes) -> Path:
    artifacts.mkdir(parents=True, exist_ok=True)
    path = artifacts / f"crash-{hashlib.sha1(data).hexdigest()}"  # noqa: S324 - a file name
    path.write_bytes(data)
    return path


def _mutate(rng: random.Random, data: bytes, pool: Sequence[bytes]) -> bytes:
    """One of libFuzzer's simpler mutations: flip, insert, delete, duplicate, splice, or an
    interesting byte."""
    buf = bytearray(data or b"\x00")
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(7)
        at = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and len(buf) > 1:
            del buf[at : at + rng.randint(1, 16)]
        elif op == 3 and buf:
            i = rng.randrange(len(buf))
            buf[at:at] = buf[i : i + rng.randint(1, 64)]
        elif op == 4 and pool:
            other = rng.choice(pool)
            i = rng.randrange(len(other) + 1)
            buf[at:] = other[i : i + rng.randint(1, 256)]
        elif op == 5 and buf:
            i = rng.randrange(len(buf))
            buf[i] = rng.choice((0, 0x7F, 0x80, 0xFF, 0x22, 0x5C, 0x0A, 0x7B, 0x7D, 0xC0))
        elif op == 6:
            buf[at:at] = rng.choice(
                (b"\\u0000", b"\\ud800", b"1e999", b"NaN", b"[" * 64, b"\xed\xa0\x80")
            )
    return bytes(buf)


def _pure_python(
    name: str, one: Callable[[bytes], None], corpus: Path, seconds: float
) -> bytes | None:
    """The fallback mutator: the crashing input, or None."""
    pool = [p.read_bytes() for p in sorted(corpus.iterdir())]
    rng = random.Random(0)  # noqa: S311 - fuzzing, not security
    deadline = time.monotonic() + seconds
    runs = 0
    for data in pool:  # every seed as it is first
        try:
            one(data)
        except Exception:
            traceback.print_exc()
            return data
    while time.monotonic() < deadline:
        data = _mutate(rng, rng.choice(pool), pool)
        runs += 1
        try:
            one(data)
        except Exception:
            traceback.print_exc()
            return data
        if runs % 50 == 0 and len(pool) < 4096:
            pool.append(data)
    print(f"fuzz {name}: {runs} inputs (pure-Python mutator), no crash", flush=True)
    return None


def child(name: str, corpus: Path, artifacts: Path, seconds: float, engine: str) -> int:
    """Inside the target's own process."""
    os.chdir(REPO)
    if engine == "atheris":
        atheris = _atheris()
        with atheris.instrument_imports(include=list(INSTRUMENT[name])):
            from tests.fuzz.targets import TARGETS

            one = TARGETS[name]()
        argv = [
            sys.argv[0],
            str(corpus),
            f"-max_total_time={max(1, int(seconds))}",
            f"-artifact_prefix={artifacts}/",
            "-timeout=20",
            "-rss_limit_mb=2048",
            "-print_final_stats=1",
        ]
        artifacts.mkdir(parents=True, exist_ok=True)
        atheris.Setup(argv, one)
        atheris.Fuzz()  # exits the process: 0 when time ran out, non-zero on a crash
        return 0
    from tests.fuzz.targets import TARGETS

    one = TARGETS[name]()
    crash = _pure_python(name, one, corpus, seconds)
    if crash is not None:
        print(f"fuzz {name}: crash kept in {_keep(artifacts, crash)}", flush=True)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from tests.fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help=f"of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--seconds", type=float, default=8.0, help="per target (default 8)")
    parser.add_argument("--corpus", type=Path, default=None, help="corpus root (kept, grows)")
    parser.add_argument("--artifacts", type=Path, default=REPO / ".fuzz-artifacts")
    parser.add_argument("--engine", choices=("auto", "atheris", "python"), default="auto")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}: choose from {', '.join(TARGETS)}")
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if _have_atheris() else "python"
    if args.child is not None:
        return child(args.child, args.corpus, args.artifacts, args.seconds, engine)
    if engine == "python":
        print("fuzz: the pure-Python mutator (atheris not installed here, or --engine python)")
    failed = []
    with tempfile.TemporaryDirectory(prefix="proof-fuzz-") as scratch:
        for name in args.targets or list(TARGETS):
            corpus = (args.corpus or Path(scratch)) / name
            n = _write_seeds(name, corpus)
            print(f"fuzz {name}: {engine}, {n} seeds, {args.seconds:g} s", flush=True)
            cmd = [sys.executable, "-m", "tests.fuzz.run", "--child", name, "--engine", engine]
            cmd += ["--corpus", str(corpus), "--artifacts", str(args.artifacts)]
            cmd += ["--seconds", str(args.seconds)]
            done = subprocess.run(cmd, cwd=REPO, check=False, timeout=args.seconds + 120)
            if done.returncode != 0:
                failed.append(name)
                print(f"fuzz {name}: CRASH (exit {done.returncode}); input in {args.artifacts}")
    if failed:
        print(f"fuzz: crashes in {', '.join(failed)}", file=sys.stderr)
        return 1
    print("fuzz: no crash")
    return 0


if __name__ == "__main__":
    sys.exit(main())
