"""The DCGM field table (contract.dcgm_fields) against DCGM's own header and dcgm-exporter's
CSVs (real files in tests/data/dcgm, provenance in SOURCES.md), and docs/dcgm-fields.md
against the table."""

from __future__ import annotations

import re
from pathlib import Path

from contract import dcgm_fields, signals
from contract.dcgm_fields import BY_NAME, FIELDS, render_markdown

DATA = Path(__file__).parent / "data" / "dcgm"
DOC = Path(__file__).resolve().parents[2] / "docs" / "dcgm-fields.md"


def _header_ids() -> dict[str, int]:
    """Every DCGM_FI_ name of dcgm_fields.h resolved to its id (aliases followed)."""
    defs: dict[str, str] = {}
    for line in (DATA / "dcgm_fields_defines.h").read_text().splitlines():
        m = re.match(r"#define\s+(DCGM_FI_\w+)\s+(\w+)", line)
        if m:
            defs[m.group(1)] = m.group(2)

    def resolve(name: str, depth: int = 0) -> int | None:
        value = defs.get(name)
        if value is None or depth > 8:
            return None
        return int(value) if value.isdigit() else resolve(value, depth + 1)

    return {name: i for name in defs if (i := resolve(name)) is not None}


def _csv_fields(path: Path) -> dict[str, str]:
    """DCGM field -> its type, for every row (commented-out rows included)."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"#?\s*(DCGM_FI_\w+)\s*,\s*(\w+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def test_every_id_and_name_is_dcgms() -> None:
    ids = _header_ids()
    wrong = [(f.name, f.id, ids.get(f.name)) for f in FIELDS if ids.get(f.name) != f.id]
    assert wrong == []
    assert len({f.id for f in FIELDS}) == len(FIELDS)


def test_both_exporter_sets_are_covered() -> None:
    for csv in ("default-counters.csv", "dcp-metrics-included.csv"):
        rows = _csv_fields(DATA / csv)
        wanted = {name for name, kind in rows.items() if kind != "label"}
        assert len(wanted) > 40
        assert sorted(wanted - set(BY_NAME)) == [], csv
        for name in wanted:
            assert EXPORTER_SET[csv] in BY_NAME[name].sets or name.endswith("_L0"), name


EXPORTER_SET = {
    "default-counters.csv": dcgm_fields.EXPORTER_DEFAULT,
    "dcp-metrics-included.csv": dcgm_fields.EXPORTER_DCP,
}


def test_kinds_agree_with_the_signal_vocabulary() -> None:
    for f in FIELDS:
        spec = signals.spec_for(f.name)
        if spec is not None:
            assert spec.kind is f.kind, f.name
        assert f.name.startswith(signals.DCGM_PREFIX)


def test_issue_17_families_are_there() -> None:
    names = set(BY_NAME)
    for family in (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L{n}",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L{n}",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L{n}",
        "DCGM_FI_PROF_NVLINK_L{n}_TX_BYTES",
    ):
        assert {family.format(n=n) for n in range(18)} <= names
    assert {
        "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "DCGM_FI_DEV_POWER_VIOLATION",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "DCGM_FI_DEV_ECC_DBE_VOL_DEV",
    } <= names
    # link 12 of the CRC flit family is id 406: DCGM's ids are not contiguous per family
    assert BY_NAME["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L12"].id == 406
    assert BY_NAME["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L6"].id == 451


def test_doc_is_generated_from_the_table() -> None:
    assert DOC.read_text() == render_markdown(), (
        "docs/dcgm-fields.md is stale: python -m contract.dcgm_fields > docs/dcgm-fields.md"
    )
    for f in FIELDS:
        shown = f.family.replace("{n}", "0..17") if f.family else f.name
        assert f"`{shown}`" in DOC.read_text()
