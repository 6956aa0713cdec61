"""Importing bcc's Python package, which is a system package (Debian `python3-bpfcc`).

bcc is not on PyPI: its Python half is pure ctypes over the system's `libbcc.so.0`, installed
for the system interpreter in `/usr/lib/python3/dist-packages/bcc`. The agent runs from its
own virtualenv or zipapp, so when `import bcc` fails we add to `sys.path` a directory that
holds nothing but a link to that package — never all of dist-packages, whose other modules
would shadow the agent's own dependencies. In order:

1. `$PROOF_BCC_PATH` (a directory containing `bcc/`),
2. `/usr/local/lib/proof-bcc` (the link scripts/setup-system.d/bcc.sh makes),
3. a private temporary directory with a link to the first system `bcc` package found.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType

LINK_DIR = "/usr/local/lib/proof-bcc"
SYSTEM_PACKAGE_DIRS: tuple[str, ...] = (
    "/usr/lib/python3/dist-packages",
    "/usr/lib/python3/site-packages",
    "/usr/lib64/python3/site-packages",
)

_private_dir: str | None = None


class BccUnavailable(RuntimeError):
    """bcc cannot be imported (not installed, or a broken install)."""


def _candidate_dirs() -> Iterator[str]:
    """Directories holding a `bcc/` package, in order; the private one is made only if
    reached."""
    global _private_dir
    env = os.environ.get("PROOF_BCC_PATH")
    for directory in ([env] if env else []) + [LINK_DIR]:
        if os.path.isfile(os.path.join(directory, "bcc", "__init__.py")):
            yield directory
    for base in SYSTEM_PACKAGE_DIRS:
        package = os.path.join(base, "bcc")
        if not os.path.isfile(os.path.join(package, "__init__.py")):
            continue
        if _private_dir is None:
            _private_dir = tempfile.mkdtemp(prefix="proof-bcc-")
            os.symlink(package, os.path.join(_private_dir, "bcc"))
            # Python has read what it needs by exit; the link itself is not needed then.
            atexit.register(shutil.rmtree, _private_dir, True)
        yield _private_dir
        return


def import_bcc() -> ModuleType:
    """The `bcc` module, found as described above; raises BccUnavailable saying why not."""
    try:
        return importlib.import_module("bcc")
    except ImportError as first_error:
        # bcc's __init__ fails with ImportError/OSError if libbcc.so is missing: report that.
        if getattr(first_error, "name", None) not in (None, "bcc"):
            raise BccUnavailable(f"bcc is installed but broken: {first_error}") from first_error
    problems = []
    for directory in _candidate_dirs():
        added = directory not in sys.path
        if added:
            sys.path.append(directory)
        try:
            return importlib.import_module("bcc")
        except (ImportError, OSError) as error:
            problems.append(f"{directory}: {error}")
            if added:
                sys.path.remove(directory)
            sys.modules.pop("bcc", None)
    detail = "; ".join(problems) if problems else "no system bcc package found"
    raise BccUnavailable(
        f"cannot import bcc (install python3-bpfcc, or set PROOF_BCC_PATH): {detail}"
    )


CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39


def _effective_capabilities() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        return None
    return None


def load_failure_hints() -> str:
    """Why bcc may have failed to compile or load, as far as can be seen from here: bcc's own
    exception only says "Failed to compile BPF module" (libbcc prints the cause on stderr)."""
    hints = []
    caps = _effective_capabilities()
    if caps is not None:

        def has(cap: int) -> bool:
            return bool(caps >> cap & 1)

        if not (has(CAP_SYS_ADMIN) or (has(CAP_BPF) and has(CAP_PERFMON))):
            hints.append("this process lacks CAP_BPF+CAP_PERFMON (or CAP_SYS_ADMIN): run as root")
    headers = f"/lib/modules/{os.uname().release}/build"
    if not os.path.exists(headers):
        hints.append(
            f"no kernel headers at {headers} (install linux-headers, or run "
            "scripts/setup-system.d/bcc.sh)"
        )
    return "; ".join(hints)
