"""Helper for build-agent.sh: the agent's runtime requirements, and copying them from an
installed environment.

    python packaging/agent_deps.py list              # base + [agent] requirements, one a line
    python packaging/agent_deps.py copy SITE_DIR     # copy those distributions (and what they
                                                     # require) from this interpreter's
                                                     # site-packages into SITE_DIR

`copy` is the offline path: it takes the exact files pip installed (binary extensions
included), so the .pyz matches this interpreter's Python version and platform.
"""

from __future__ import annotations

import re
import shutil
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Never in the node executable, whatever pulls them in (DEVELOPERS.md: the agent imports no
# Django); checked again by the build test.
FORBIDDEN = {"django", "celery", "psycopg", "psycopg-binary", "channels", "djangorestframework"}


def requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["agent"])


def _name(requirement: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not m:
        raise SystemExit(f"cannot read a package name from requirement {requirement!r}")
    return m.group(1).lower().replace("_", "-")


def _marker_ok(requirement: str) -> bool:
    if ";" not in requirement:
        return True
    marker = requirement.split(";", 1)[1]
    if "extra" in marker:
        return False  # optional extras of dependencies are not needed at run time
    try:
        from packaging.markers import Marker
    except ImportError:
        return True
    return bool(Marker(marker).evaluate())


def copy(site: Path) -> list[str]:
    site.mkdir(parents=True, exist_ok=True)
    todo = [_name(r) for r in requirements()]
    done: list[str] = []
    while todo:
        name = todo.pop()
        if name in done:
            continue
        if name in FORBIDDEN:
            raise SystemExit(f"{name} must not be in the agent executable")
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(
                f"{name} is not installed in {sys.prefix}: install the agent's requirements "
                "there first (pip install '.[agent]'), or build with DEPS_FROM=pypi"
            ) from None
        done.append(name)
        for file in dist.files or ():
            src = Path(str(file.locate()))
            rel = Path(str(file))
            if (rel.parts and rel.parts[0] in ("..", "bin")) or "__pycache__" in rel.parts:
                continue
            dst = site / rel
            if src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        for req in dist.requires or ():
            if _marker_ok(req):
                todo.append(_name(req))
    return done


def main(argv: list[str]) -> int:
    if argv[:1] == ["list"]:
        print("\n".join(requirements()))
        return 0
    if len(argv) == 2 and argv[0] == "copy":
        names = copy(Path(argv[1]))
        print("copied: " + ", ".join(sorted(names)), file=sys.stderr)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
