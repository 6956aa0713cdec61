"""The DCGM fields Proof collects: one table, the single source of the collector's field groups,
the simulated DCGM's values and docs/dcgm-fields.md (`python -m contract.dcgm_fields` writes it).

Ids and names are DCGM's own (`dcgmlib/dcgm_fields.h`, NVIDIA/DCGM @ 72fa3fea); names are the
ones dcgm-exporter's CSVs use (DCGM 4 headers renamed several fields, e.g.
`DCGM_FI_DEV_MEMORY_TEMP` → `DCGM_FI_DEV_MEMORY_TEMP_CELSIUS`, and keep the old names as
aliases of the same ids). The set: every field of dcgm-exporter's `default-counters.csv` and
`dcp-metrics-included.csv` (commented-out rows included, `label` rows and the exporter's own
`DCGM_EXP_*` excluded) plus the device fields issue 17 names: tensor and integer pipes, clock
event (throttle) reasons and violation times, per-location ECC, PCIe link state, row remapping,
and NVLink errors and throughput per link.

`kind` uses contract.signals.Kind: gauge, counter (cumulative as DCGM reports it: use deltas)
or bitmask. `support` is one of SUPPORT (which GPUs report the field); a GPU that does not is
answered NOT_SUPPORTED by DCGM, and the agent then stops asking for that field on that GPU
(`proof-agent doctor` lists them). `rate` says how often the agent reads it: FAST every
interval, SLOW every SLOW_EVERY_S (cumulative counters and per-link fields: a counter read every
10 s loses nothing but time resolution, and 18 links x 7 fields per GPU at 1 Hz would cost more
than the whole rest of the agent). Every name here is a DCGM name (`DCGM_FI_` prefix, GPU
scope); names already in contract.signals keep the kind declared there.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass

from contract.signals import Kind

FAST = "fast"
SLOW = "slow"
SLOW_EVERY_S = 10.0
NVLINK_MAX_LINKS = 18  # DCGM_NVLINK_MAX_LINKS_PER_GPU (H100/H200 SXM: 18; A100: 12; V100: 6)

# Which GPUs report a field (the `support` column).
ALL = "all"
DCP = "dcp"
DCP_CYCLES = "dcp_cycles"
ECC = "ecc"
HBM = "hbm"
AMPERE_PLUS = "ampere+"
PRE_AMPERE = "pre-ampere"
NVLINK = "nvlink"
NVENC = "nvenc"
NVDEC = "nvdec"
VGPU = "vgpu"
SUPPORT: dict[str, str] = {
    ALL: "every GPU DCGM supports",
    DCP: "datacenter Volta and newer (V100, A100, H100/H200, L40S…): DCGM profiling",
    DCP_CYCLES: "DCP GPUs, with a DCGM 4 host engine that has these cumulative fields",
    ECC: "GPUs with ECC memory (datacenter parts); some locations NotSupported on some models",
    HBM: "HBM GPUs (V100, A100, H100/H200); GDDR boards report no memory temperature",
    AMPERE_PLUS: "Ampere and newer (row remapping replaced page retirement)",
    PRE_AMPERE: "Kepler to Volta (page retirement; Ampere and newer remap rows instead)",
    NVLINK: "NVLink GPUs (SXM); per-link fields for the links the GPU has (V100 6, A100 12, H100 18)",
    NVENC: "GPUs with a video encoder (T4, L4, L40S, A10); not A100/H100",
    NVDEC: "GPUs with a video decoder (most datacenter parts, A100 and H100 included)",
    VGPU: "vGPU guests only",
}

# dcgm-exporter's sets a field comes from (the `sets` column).
EXPORTER_DEFAULT = "default"  # etc/default-counters.csv
EXPORTER_DCP = "dcp"  # etc/dcp-metrics-included.csv
ISSUE_17 = "issue17"  # the extra device fields issue 17 names


@dataclass(frozen=True, slots=True)
class DcgmField:
    id: int
    name: str
    unit: str
    kind: Kind
    support: str
    rate: str
    sets: tuple[str, ...]
    description: str
    link: int | None = None  # the NVLink a per-link field is about
    family: str | None = None  # per-link fields: the name with L<n> replaced by L{n}


_GA, _C, _B = Kind.GAUGE, Kind.COUNTER, Kind.BITMASK
_D, _P, _X = (EXPORTER_DEFAULT, EXPORTER_DCP), (EXPORTER_DCP,), (ISSUE_17,)
_DX = (EXPORTER_DEFAULT,)  # default-counters.csv only (the newer DCGM 4 cumulative rows)


def _f(
    id_: int,
    name: str,
    unit: str,
    kind: Kind,
    support: str,
    sets: tuple[str, ...],
    description: str,
    rate: str | None = None,
) -> DcgmField:
    if rate is None:
        rate = SLOW if kind is Kind.COUNTER else FAST
    return DcgmField(id_, "DCGM_FI_" + name, unit, kind, support, rate, sets, description)


def _links(
    family: str,
    ids: Iterable[int],
    unit: str,
    kind: Kind,
    support: str,
    sets: tuple[str, ...],
    d: str,
) -> list[DcgmField]:
    """One field per NVLink: `family` has `{n}` where the link number goes."""
    out = []
    for link, id_ in enumerate(ids):
        name = "DCGM_FI_" + family.format(n=link)
        out.append(
            DcgmField(
                id_,
                name,
                unit,
                kind,
                support,
                SLOW,
                sets,
                f"{d}, link {link}",
                link,
                "DCGM_FI_" + family,
            )
        )
    return out


def _ids(*ranges: range) -> list[int]:
    return [i for r in ranges for i in r]


# Per-link ids are not contiguous: DCGM added links 6-11 and 12-17 in later blocks.
_CRC_FLIT_IDS = _ids(range(400, 406), range(451, 457), range(406, 409), range(481, 484))
_CRC_DATA_IDS = _ids(range(410, 416), range(457, 463), range(416, 419), range(484, 487))
_REPLAY_IDS = _ids(range(420, 426), range(463, 469), range(426, 429), range(487, 490))
_RECOVERY_IDS = _ids(range(430, 436), range(469, 475), range(436, 439), range(491, 494))
_BANDWIDTH_IDS = _ids(range(440, 446), range(475, 481), range(446, 449), range(494, 497))
_PROF_NVLINK_TX_IDS = list(range(1040, 1076, 2))
_PROF_NVLINK_RX_IDS = list(range(1041, 1076, 2))

FIELDS: tuple[DcgmField, ...] = (
    # clocks
    _f(100, "DEV_SM_CLOCK", "MHz", _GA, ALL, _D, "SM clock"),
    _f(101, "DEV_MEM_CLOCK", "MHz", _GA, ALL, _D, "memory clock"),
    _f(112, "DEV_CLOCK_THROTTLE_REASONS", "bitmask", _B, ALL, _X, "clock event reasons"),
    # temperature, power
    _f(140, "DEV_MEMORY_TEMP", "C", _GA, HBM, _D, "memory (HBM) temperature"),
    _f(150, "DEV_GPU_TEMP", "C", _GA, ALL, _D, "GPU temperature"),
    _f(155, "DEV_POWER_USAGE", "W", _GA, ALL, _D, "power draw"),
    _f(156, "DEV_TOTAL_ENERGY_CONSUMPTION", "mJ", _C, ALL, _D, "energy since driver load"),
    # PCIe
    _f(202, "DEV_PCIE_REPLAY_COUNTER", "replays", _C, ALL, _D, "PCIe retries"),
    _f(235, "DEV_PCIE_MAX_LINK_GEN", "gen", _GA, ALL, _X, "PCIe max link generation", SLOW),
    _f(236, "DEV_PCIE_MAX_LINK_WIDTH", "lanes", _GA, ALL, _X, "PCIe max link width", SLOW),
    _f(237, "DEV_PCIE_LINK_GEN", "gen", _GA, ALL, _X, "PCIe current link generation"),
    _f(238, "DEV_PCIE_LINK_WIDTH", "lanes", _GA, ALL, _X, "PCIe current link width"),
    # utilization
    _f(203, "DEV_GPU_UTIL", "%", _GA, ALL, _D, "GPU utilization"),
    _f(204, "DEV_MEM_COPY_UTIL", "%", _GA, ALL, _D, "memory (copy engine) utilization"),
    _f(206, "DEV_ENC_UTIL", "%", _GA, NVENC, _D, "encoder utilization"),
    _f(207, "DEV_DEC_UTIL", "%", _GA, NVDEC, _D, "decoder utilization"),
    # errors and violations
    _f(230, "DEV_XID_ERRORS", "xid", _GA, ALL, _D, "last XID error"),
    _f(240, "DEV_POWER_VIOLATION", "ns", _C, ALL, _D, "throttled by power"),
    _f(241, "DEV_THERMAL_VIOLATION", "ns", _C, ALL, _D, "throttled by temperature"),
    _f(242, "DEV_SYNC_BOOST_VIOLATION", "ns", _C, ALL, _D, "throttled by sync boost"),
    _f(243, "DEV_BOARD_LIMIT_VIOLATION", "ns", _C, ALL, _D, "throttled by board limit"),
    _f(244, "DEV_LOW_UTIL_VIOLATION", "ns", _C, ALL, _D, "throttled by low utilization"),
    _f(245, "DEV_RELIABILITY_VIOLATION", "ns", _C, ALL, _D, "throttled by reliability"),
    _f(246, "DEV_TOTAL_APP_CLOCKS_VIOLATION", "ns", _C, ALL, _X, "below application clocks"),
    _f(247, "DEV_TOTAL_BASE_CLOCKS_VIOLATION", "ns", _C, ALL, _X, "below base clocks"),
    # memory
    _f(251, "DEV_FB_FREE", "MiB", _GA, ALL, _D, "framebuffer free"),
    _f(252, "DEV_FB_USED", "MiB", _GA, ALL, _D, "framebuffer used"),
    _f(253, "DEV_FB_RESERVED", "MiB", _GA, ALL, _D, "framebuffer reserved", SLOW),
    # ECC totals, then per location (volatile)
    _f(310, "DEV_ECC_SBE_VOL_TOTAL", "errors", _C, ECC, _D, "single-bit ECC, volatile"),
    _f(311, "DEV_ECC_DBE_VOL_TOTAL", "errors", _C, ECC, _D, "double-bit ECC, volatile"),
    _f(312, "DEV_ECC_SBE_AGG_TOTAL", "errors", _C, ECC, _D, "single-bit ECC, lifetime"),
    _f(313, "DEV_ECC_DBE_AGG_TOTAL", "errors", _C, ECC, _D, "double-bit ECC, lifetime"),
    _f(314, "DEV_ECC_SBE_VOL_L1", "errors", _C, ECC, _X, "single-bit ECC, volatile, L1"),
    _f(315, "DEV_ECC_DBE_VOL_L1", "errors", _C, ECC, _X, "double-bit ECC, volatile, L1"),
    _f(316, "DEV_ECC_SBE_VOL_L2", "errors", _C, ECC, _X, "single-bit ECC, volatile, L2"),
    _f(317, "DEV_ECC_DBE_VOL_L2", "errors", _C, ECC, _X, "double-bit ECC, volatile, L2"),
    _f(318, "DEV_ECC_SBE_VOL_DEV", "errors", _C, ECC, _X, "single-bit ECC, volatile, DRAM"),
    _f(319, "DEV_ECC_DBE_VOL_DEV", "errors", _C, ECC, _X, "double-bit ECC, volatile, DRAM"),
    _f(320, "DEV_ECC_SBE_VOL_REG", "errors", _C, ECC, _X, "single-bit ECC, volatile, registers"),
    _f(321, "DEV_ECC_DBE_VOL_REG", "errors", _C, ECC, _X, "double-bit ECC, volatile, registers"),
    _f(322, "DEV_ECC_SBE_VOL_TEX", "errors", _C, ECC, _X, "single-bit ECC, volatile, texture"),
    _f(323, "DEV_ECC_DBE_VOL_TEX", "errors", _C, ECC, _X, "double-bit ECC, volatile, texture"),
    # page retirement (before Ampere) and row remapping (Ampere and newer)
    _f(390, "DEV_RETIRED_SBE", "pages", _C, PRE_AMPERE, _D, "pages retired (SBE)"),
    _f(391, "DEV_RETIRED_DBE", "pages", _C, PRE_AMPERE, _D, "pages retired (DBE)"),
    _f(392, "DEV_RETIRED_PENDING", "pages", _GA, PRE_AMPERE, _D, "pages pending retirement"),
    _f(393, "DEV_UNCORRECTABLE_REMAPPED_ROWS", "rows", _C, AMPERE_PLUS, _D, "rows remapped (DBE)"),
    _f(394, "DEV_CORRECTABLE_REMAPPED_ROWS", "rows", _C, AMPERE_PLUS, _D, "rows remapped (SBE)"),
    _f(395, "DEV_ROW_REMAP_FAILURE", "flag", _C, AMPERE_PLUS, _D, "a row remap failed"),
    _f(396, "DEV_ROW_REMAP_PENDING", "flag", _GA, AMPERE_PLUS, _X, "a remap waits for a reset"),
    # NVLink totals
    _f(
        409,
        "DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "errors",
        _C,
        NVLINK,
        _D,
        "NVLink CRC flit errors",
    ),
    _f(
        419,
        "DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "errors",
        _C,
        NVLINK,
        _D,
        "NVLink CRC data errors",
    ),
    _f(429, "DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "errors", _C, NVLINK, _D, "NVLink retries"),
    _f(439, "DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "errors", _C, NVLINK, _D, "NVLink recoveries"),
    _f(449, "DEV_NVLINK_BANDWIDTH_TOTAL", "MiB/s", _GA, NVLINK, _D, "NVLink throughput, TX+RX"),
    _f(526, "DEV_VGPU_LICENSE_STATUS", "status", _GA, VGPU, _D, "vGPU license status", SLOW),
    # profiling (DCP)
    _f(1001, "PROF_GR_ENGINE_ACTIVE", "ratio", _GA, DCP, _D, "graphics engine active"),
    _f(1002, "PROF_SM_ACTIVE", "ratio", _GA, DCP, _D, "SMs with a warp resident"),
    _f(1003, "PROF_SM_OCCUPANCY", "ratio", _GA, DCP, _D, "warps resident / max"),
    _f(1004, "PROF_PIPE_TENSOR_ACTIVE", "ratio", _GA, DCP, _D, "tensor pipes active"),
    _f(1005, "PROF_DRAM_ACTIVE", "ratio", _GA, DCP, _D, "device memory interface active"),
    _f(1006, "PROF_PIPE_FP64_ACTIVE", "ratio", _GA, DCP, _D, "FP64 pipes active"),
    _f(1007, "PROF_PIPE_FP32_ACTIVE", "ratio", _GA, DCP, _D, "FP32 pipes active"),
    _f(1008, "PROF_PIPE_FP16_ACTIVE", "ratio", _GA, DCP, _D, "FP16 pipes active"),
    _f(1009, "PROF_PCIE_TX_BYTES", "B/s", _GA, DCP, _D, "PCIe bytes transmitted per second"),
    _f(1010, "PROF_PCIE_RX_BYTES", "B/s", _GA, DCP, _D, "PCIe bytes received per second"),
    _f(1011, "PROF_NVLINK_TX_BYTES", "B/s", _GA, DCP, _X, "NVLink bytes transmitted per second"),
    _f(1012, "PROF_NVLINK_RX_BYTES", "B/s", _GA, DCP, _X, "NVLink bytes received per second"),
    _f(1013, "PROF_PIPE_TENSOR_IMMA_ACTIVE", "ratio", _GA, DCP, _X, "integer tensor pipe active"),
    _f(1014, "PROF_PIPE_TENSOR_HMMA_ACTIVE", "ratio", _GA, DCP, _X, "half tensor pipe active"),
    _f(1015, "PROF_PIPE_TENSOR_DFMA_ACTIVE", "ratio", _GA, DCP, _X, "FP64 tensor pipe active"),
    _f(1016, "PROF_PIPE_INT_ACTIVE", "ratio", _GA, DCP, _X, "integer pipe active"),
    # DCP cumulative counters (default-counters.csv, commented out there)
    _f(1084, "PROF_SM_CYCLES_ELAPSED_TOTAL", "cycles", _C, DCP_CYCLES, _DX, "SM cycles elapsed"),
    _f(1085, "PROF_SM_CYCLES_ACTIVE_TOTAL", "cycles", _C, DCP_CYCLES, _DX, "SM cycles active"),
    _f(1086, "PROF_MMA_CYCLES_ACTIVE_TOTAL", "cycles", _C, DCP_CYCLES, _DX, "MMA cycles active"),
    _f(1087, "PROF_DMMA_CYCLES_ACTIVE_TOTAL", "cycles", _C, DCP_CYCLES, _DX, "DMMA cycles"),
    _f(1088, "PROF_HMMA_CYCLES_ACTIVE_TOTAL", "cycles", _C, DCP_CYCLES, _DX, "HMMA cycles"),
    _f(1089, "PROF_IMMA_CYCLES_ACTIVE_TOTAL", "cycles", _C, DCP_CYCLES, _DX, "IMMA cycles"),
    _f(1090, "PROF_DFMA_CYCLES_ACTIVE_TOTAL", "cycles", _C, DCP_CYCLES, _DX, "DFMA cycles"),
    _f(1091, "PROF_PCIE_TX_BYTES_TOTAL", "bytes", _C, DCP_CYCLES, _DX, "PCIe bytes transmitted"),
    _f(1092, "PROF_PCIE_RX_BYTES_TOTAL", "bytes", _C, DCP_CYCLES, _DX, "PCIe bytes received"),
    _f(1093, "PROF_INT_CYCLES_ACTIVE_TOTAL", "cycles", _C, DCP_CYCLES, _DX, "integer pipe cycles"),
    _f(1094, "PROF_FP64_CYCLES_ACTIVE_TOTAL", "cycles", _C, DCP_CYCLES, _DX, "FP64 pipe cycles"),
    _f(1095, "PROF_FP32_CYCLES_ACTIVE_TOTAL", "cycles", _C, DCP_CYCLES, _DX, "FP32 pipe cycles"),
    _f(1096, "PROF_FP16_CYCLES_ACTIVE_TOTAL", "cycles", _C, DCP_CYCLES, _DX, "FP16 pipe cycles"),
    # NVLink per link
    *_links(
        "DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L{n}",
        _CRC_FLIT_IDS,
        "errors",
        _C,
        NVLINK,
        _X,
        "NVLink CRC flit errors",
    ),
    *_links(
        "DEV_NVLINK_CRC_DATA_ERROR_COUNT_L{n}",
        _CRC_DATA_IDS,
        "errors",
        _C,
        NVLINK,
        _X,
        "NVLink CRC data errors",
    ),
    *_links(
        "DEV_NVLINK_REPLAY_ERROR_COUNT_L{n}",
        _REPLAY_IDS,
        "errors",
        _C,
        NVLINK,
        _X,
        "NVLink retries",
    ),
    *_links(
        "DEV_NVLINK_RECOVERY_ERROR_COUNT_L{n}",
        _RECOVERY_IDS,
        "errors",
        _C,
        NVLINK,
        _X,
        "NVLink recoveries",
    ),
    *_links(
        "DEV_NVLINK_BANDWIDTH_L{n}",
        _BANDWIDTH_IDS,
        "MiB/s",
        _GA,
        NVLINK,
        _D,
        "NVLink throughput, TX+RX",
    ),
    *_links(
        "PROF_NVLINK_L{n}_TX_BYTES",
        _PROF_NVLINK_TX_IDS,
        "B/s",
        _GA,
        NVLINK,
        _X,
        "NVLink bytes transmitted per second",
    ),
    *_links(
        "PROF_NVLINK_L{n}_RX_BYTES",
        _PROF_NVLINK_RX_IDS,
        "B/s",
        _GA,
        NVLINK,
        _X,
        "NVLink bytes received per second",
    ),
)

BY_ID: dict[int, DcgmField] = {f.id: f for f in FIELDS}
BY_NAME: dict[str, DcgmField] = {f.name: f for f in FIELDS}
if len(BY_ID) != len(FIELDS) or len(BY_NAME) != len(FIELDS):  # pragma: no cover - a typo
    raise RuntimeError("contract.dcgm_fields: duplicate field id or name")


def field_ids(rate: str | None = None) -> list[int]:
    """The ids of every field, or of those read at `rate` (FAST or SLOW), in table order."""
    return [f.id for f in FIELDS if rate is None or f.rate == rate]


# --- docs/dcgm-fields.md --------------------------------------------------------------------

DOC_HEADER = """# DCGM fields

Generated from `contract/dcgm_fields.py` by `python -m contract.dcgm_fields > docs/dcgm-fields.md`
(`agent/tests/test_dcgm_fields.py` fails when this file and the table disagree). Do not edit by
hand.

What the agent watches through pydcgm field groups (agent/collectors/dcgm.py) and what the
simulated DCGM (agent/collectors/dcgm_sim.py) answers. Sets: `default` = dcgm-exporter's
`etc/default-counters.csv`, `dcp` = its `etc/dcp-metrics-included.csv` (rows commented out
there included), `issue17` = the other device fields issue 17 names. Read: `fast` every interval
(1 s), `slow` every 10 s. A field a GPU answers NOT_SUPPORTED is skipped for that GPU from then
on and listed by `proof-agent doctor`. Fields NVML already reads (agent/collectors/nvml.py) are
taken from NVML when both run; the DCGM collector leaves them out.

Per-link NVLink fields are one row per family; the ids are those of links 0..17 in order.
"""


def _doc_rows() -> list[str]:
    rows = [
        "| id | DCGM name | unit | kind | read | sets | GPUs that support it | meaning |",
        "|---:|---|---|---|---|---|---|---|",
    ]
    seen: set[str] = set()
    for f in FIELDS:
        if f.family is not None:
            if f.family in seen:
                continue
            seen.add(f.family)
            members = [g for g in FIELDS if g.family == f.family]
            ids = ", ".join(str(g.id) for g in members)
            name = f.family.replace("{n}", "0..17")
            meaning = f.description.rsplit(", link", 1)[0] + ", per link"
        else:
            ids, name, meaning = str(f.id), f.name, f.description
        rows.append(
            f"| {ids} | `{name}` | {f.unit} | {f.kind.value} | {f.rate} | {', '.join(f.sets)} "
            f"| {SUPPORT[f.support]} | {meaning} |"
        )
    return rows


def render_markdown() -> str:
    per_link = sum(1 for f in FIELDS if f.link is not None)
    summary = (
        f"{len(FIELDS)} fields: {len(FIELDS) - per_link} per GPU and {per_link} per NVLink "
        f"({per_link // NVLINK_MAX_LINKS} families x {NVLINK_MAX_LINKS} links); "
        f"{len(field_ids(FAST))} read every interval, {len(field_ids(SLOW))} every "
        f"{SLOW_EVERY_S:g} s."
    )
    return "\n".join([DOC_HEADER, summary, "", *_doc_rows(), ""])


def main(argv: list[str] | None = None) -> int:
    sys.stdout.write(render_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
