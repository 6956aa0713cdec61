"""Extract a ttar archive (the text archive format of prometheus/procfs test fixtures) into a
directory: `Directory: p` / `Path: p` + `Lines: n` + n content lines (a last line ending in
`EOF` has no trailing newline) / `Mode: m` / `SymlinkTo: t`, records separated by `# ttar`."""

from __future__ import annotations

import os
from pathlib import Path


class TtarError(ValueError):
    pass


def extract(archive: Path, dest: Path) -> list[Path]:
    """Write every file of `archive` under `dest`; returns the files written."""
    lines = archive.read_text().split("\n")
    written: list[Path] = []
    i = 0
    current: Path | None = None
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line or line.startswith("# ttar"):
            continue
        key, _, value = line.partition(": ")
        if key == "Directory":
            (dest / value).mkdir(parents=True, exist_ok=True)
            current = None
        elif key == "Path":
            current = dest / value
            current.parent.mkdir(parents=True, exist_ok=True)
        elif key == "Lines":
            if current is None:
                raise TtarError(f"line {i}: 'Lines' without a 'Path'")
            count = int(value)
            body = lines[i : i + count]
            i += count
            text = "\n".join(body) + ("\n" if body else "")
            if text.endswith("EOF\n"):
                text = text[: -len("EOF\n")]
            current.write_bytes(text.replace("NULLBYTE", "\0").encode())
            written.append(current)
        elif key == "SymlinkTo":
            if current is None:
                raise TtarError(f"line {i}: 'SymlinkTo' without a 'Path'")
            os.symlink(value, current)
        elif key == "Mode":
            target = current
            if target is not None and target.exists() and not target.is_symlink():
                target.chmod(int(value, 8))
        else:
            raise TtarError(f"line {i}: unexpected {line[:60]!r}")
    return written
