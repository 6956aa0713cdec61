"""The repository stands alone: nothing tracked cites the product brief that lived outside the
checkout, and every "docs/design.md §N" cited in the tree names a section that exists.

The brief was a file beside the checkout (`../shared/…`); its contract is now docs/design.md
(numbered sections, "## §N Title"), which code and docs cite as "docs/design.md §N". Someone
who clones the repository has nothing outside it, so a citation of the old file, or of a
section design.md does not have, points at nothing.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()
DESIGN = REPO / "docs" / "design.md"

# Spelled in pieces so this file does not match itself.
_OUTSIDE = ("DESIGN" + " §", "DESIGN" + ".md", "DESIGN" + " case", ".." + "/shared")
# "docs/design.md §3", "docs/design.md §3–§4", "docs/design.md §3–4", "docs/design.md §1, §3–§6"
_CITATION = re.compile(r"docs/design\.md (§\d+(?:(?:, ?| ?[–-] ?)§?\d+)*)")
_SECTION = re.compile(r"^## §(\d+) ", re.MULTILINE)


def _tracked_texts() -> list[tuple[str, str]]:
    """(path, text) of every tracked file that exists and is text (binary files skipped)."""
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    texts = []
    for name in filter(None, out.split("\0")):
        path = REPO / name
        if name == THIS or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (gzip traces, compiled probe objects)
        texts.append((name, data.decode("utf-8", "replace")))
    return texts


def _lines_with(texts: list[tuple[str, str]], needle: str) -> list[str]:
    return [
        f"{name}:{i}: {line.strip()}"
        for name, text in texts
        if needle in text
        for i, line in enumerate(text.splitlines(), 1)
        if needle in line
    ]


def test_no_tracked_file_cites_the_brief_outside_the_checkout() -> None:
    texts = _tracked_texts()
    assert len(texts) > 100  # the listing worked
    found = [hit for needle in _OUTSIDE for hit in _lines_with(texts, needle)]
    assert found == [], "cite docs/design.md §N instead:\n" + "\n".join(found)


def test_design_sections_are_numbered_in_order() -> None:
    numbers = [int(n) for n in _SECTION.findall(DESIGN.read_text())]
    assert numbers == list(range(1, len(numbers) + 1))
    assert len(numbers) >= 7  # identity, signals, trace, families and verdict are §3–§7


def test_every_cited_design_section_exists() -> None:
    sections = {int(n) for n in _SECTION.findall(DESIGN.read_text())}
    cited: dict[int, list[str]] = {}
    for name, text in _tracked_texts():
        for match in _CITATION.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            for number in re.findall(r"\d+", match.group(1)):
                cited.setdefault(int(number), []).append(f"{name}:{line}")
    assert cited, "no docs/design.md §N citation found: the pattern is wrong"
    missing = {n: where for n, where in cited.items() if n not in sections}
    assert missing == {}, f"docs/design.md has no such section: {missing}"


def test_the_citation_pattern_reads_ranges_and_lists() -> None:
    text = "docs/design.md §3–§4, docs/design.md §3–4 and docs/design.md §1, §3–§6."
    numbers = [re.findall(r"\d+", m.group(1)) for m in _CITATION.finditer(text)]
    assert numbers == [["3", "4"], ["3", "4"], ["1", "3", "6"]]
