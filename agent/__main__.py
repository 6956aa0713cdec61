"""`python -m agent`, and the entry point of the PyInstaller one-file `proof-agent`
(packaging/build-agent.sh, FORMAT=pyinstaller): Python and every dependency are inside the
file; nothing is needed on the node but the NVIDIA driver.

eBPF: bcc's Python module must match the node's libbcc and kernel, so it is never bundled; when
the node has it (python3-bpfcc: /usr/lib/python3/dist-packages/bcc, pure Python over ctypes),
that directory is added at the *end* of sys.path, after everything bundled, so only `bcc`
comes from there. Only when frozen: an interpreter's own sys.path already says where bcc is.
"""

from __future__ import annotations

import os
import sys

from agent.cli import main

SYSTEM_BCC_DIRS = ("/usr/lib/python3/dist-packages", "/usr/lib64/python3/site-packages")


def _system_bcc() -> None:
    for path in SYSTEM_BCC_DIRS:
        if os.path.isdir(os.path.join(path, "bcc")) and path not in sys.path:
            sys.path.append(path)
            return


if __name__ == "__main__":
    if getattr(sys, "frozen", False):
        _system_bcc()
    sys.exit(main())
