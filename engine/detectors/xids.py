"""NVIDIA XID catalogue: which driver XIDs are a fault that hits the job, which are a warning
about the GPU's health, and which are the application's own error.

Source: NVIDIA's "XID Errors" document (GPU deployment and management documentation,
https://docs.nvidia.com/deploy/xid-errors/index.html: per XID its failure, whether NVIDIA marks
it critical, and its possible causes — hardware, driver, user application, bus, thermal,
framebuffer corruption) and its Xid catalogue for Ampere and later
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html: the resolution
bucket per XID — RESTART_APP, RESET_GPU, RESTART_BM, CHECK_APP/CUDA, …). docs/detectors.md
("Fault and warning XIDs") has the table with the reasoning for each class.

- `FAULT`: the GPU, its memory or its links failed in a way that kills or corrupts the work on
  it (NVIDIA: critical, or the application that met it must be restarted) → `hardware_fault`
  on the job whose GPU it is.
- `WARNING`: the GPU corrected the error or recorded it and keeps running (NVIDIA: not
  critical; reset "when convenient") → evidence for fleet health (`gpu_degrading`), never a
  verdict on the job.
- `APPLICATION`: usually the job's own bug (illegal address, MMU fault, a channel reset after
  the program's own exception, cleanup after another error) → not evidence against the
  hardware; listed in the hardware clearance as seen, the clearance stays clear.

An XID not in the catalogue is reported in the clearance and is no evidence either way.
"""

from __future__ import annotations

from dataclasses import dataclass

FAULT = "fault"
WARNING = "warning"
APPLICATION = "application"


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str  # NVIDIA's failure text
    kind: str  # FAULT | WARNING | APPLICATION
    why: str  # one line: what NVIDIA says that puts it in this class


_ROWS: tuple[XidInfo, ...] = (
    # --- application: the job's own error ------------------------------------------------
    XidInfo(
        13,
        "Graphics Engine Exception",
        APPLICATION,
        "not critical; illegal memory access, out-of-range arrays or bad instructions in the "
        "program (restart, debug with compute-sanitizer); rarely hardware",
    ),
    XidInfo(
        31,
        "GPU memory page fault",
        APPLICATION,
        "not critical; MMU fault on an illegal address made by the application",
    ),
    XidInfo(
        43,
        "GPU stopped processing",
        APPLICATION,
        "not critical; the application hit a software-induced fault (reset channel verif)",
    ),
    XidInfo(
        45,
        "Preemptive cleanup, due to previous errors",
        APPLICATION,
        "not critical, informational: channels removed because the program was stopped or "
        "another error came first",
    ),
    XidInfo(
        137,
        "NVLink FLA privilege error",
        APPLICATION,
        "not critical; an illegal NVLink peer-to-peer access, typically an application bug",
    ),
    # --- warning: corrected or recorded, the GPU keeps running -----------------------------
    XidInfo(
        63,
        "ECC page retirement or row remapping recording event",
        WARNING,
        "not critical; the remap was recorded, applications keep running until a convenient "
        "reset (restart only the one that also got XID 94)",
    ),
    XidInfo(
        92,
        "High single-bit ECC error rate",
        WARNING,
        "not critical: single-bit errors are corrected by the GPU; run field diagnostics",
    ),
    XidInfo(
        93,
        "Non-fatal violation of provisioned InfoROM wear limit",
        WARNING,
        "not critical; InfoROM wear",
    ),
    XidInfo(
        121,
        "C2C Link corrected error",
        WARNING,
        "corrected errors on the C2C link to the Grace CPU, no operational impact; reset the "
        "GPU to retrain the link when convenient",
    ),
    XidInfo(
        168,
        "Reduced GPU Memory Capacity",
        WARNING,
        "not critical; errors in the write-protected region, capacity reduced",
    ),
    # --- fault: hits the work on the GPU ---------------------------------------------------
    XidInfo(
        48,
        "Double Bit ECC Error",
        FAULT,
        "critical; an uncorrectable error, reported to the application; reset the GPU",
    ),
    XidInfo(
        61,
        "Internal micro-controller breakpoint/warning",
        FAULT,
        "critical; the GPU's internal engine stops working; reset the GPU",
    ),
    XidInfo(62, "Internal micro-controller halt", FAULT, "critical; PMU halt; reset the GPU"),
    XidInfo(
        64,
        "ECC page retirement or row remapper recording failure",
        FAULT,
        "critical; the remap could not be recorded; reboot immediately",
    ),
    XidInfo(
        69,
        "Graphics Engine class error",
        FAULT,
        "critical; uncorrectable GPU error; stop the work and reboot",
    ),
    XidInfo(
        74,
        "NVLink Error",
        FAULT,
        "critical; a link to another GPU or NVSwitch failed; reset the GPU or reboot",
    ),
    XidInfo(
        79,
        "GPU has fallen off the bus",
        FAULT,
        "critical; the driver can no longer reach the GPU over PCIe",
    ),
    XidInfo(
        94,
        "Contained ECC error",
        FAULT,
        "not critical for the node (other applications are unaffected), but the application "
        "that met the error must be restarted: for that job it is a fault",
    ),
    XidInfo(
        95,
        "Uncontained ECC error",
        FAULT,
        "critical; affects every application on the GPU; reset before restarting",
    ),
    XidInfo(119, "GSP RPC Timeout", FAULT, "critical; the GSP stopped answering; reset the GPU"),
    XidInfo(120, "GSP Error", FAULT, "critical; GSP failure; reset the GPU"),
    XidInfo(123, "SPI PMU RPC Write Failure", FAULT, "critical; reset the GPU"),
    XidInfo(136, "Link Training Failed", FAULT, "critical; hardware or bus error"),
    XidInfo(
        140,
        "Unrecovered ECC Error",
        FAULT,
        "critical; uncorrectable memory errors the driver could not retire or remap",
    ),
    XidInfo(143, "GPU Initialization Failure", FAULT, "critical; the GPU failed to initialise"),
    XidInfo(
        154,
        "GPU Recovery Action Changed",
        FAULT,
        "critical; the GPU now requires a reset, a node reboot or drain-and-reset",
    ),
    XidInfo(167, "PCIe Fatal Timeout", FAULT, "critical; hardware or bus error"),
    XidInfo(169, "Internal micro-controller halt (SEC2)", FAULT, "critical; reset the GPU"),
    XidInfo(171, "Uncorrectable DRAM Error", FAULT, "critical; detail of XID 48 (DRAM)"),
    XidInfo(172, "Uncorrectable SRAM Error", FAULT, "critical; detail of XID 48 (SRAM)"),
)

CATALOGUE: dict[int, XidInfo] = {x.code: x for x in _ROWS}
FAULT_XIDS = frozenset(c for c, x in CATALOGUE.items() if x.kind == FAULT)
WARNING_XIDS = frozenset(c for c, x in CATALOGUE.items() if x.kind == WARNING)


def xid_kind(code: float | int | None) -> str | None:
    """FAULT, WARNING or APPLICATION for a catalogued XID code; None when unknown."""
    if code is None:
        return None
    try:
        info = CATALOGUE.get(int(code))
    except (TypeError, ValueError, OverflowError):
        return None
    return info.kind if info else None


def xid_name(code: float | int) -> str:
    info = CATALOGUE.get(int(code))
    return f"XID {int(code)}" + (f" ({info.name})" if info else "")
