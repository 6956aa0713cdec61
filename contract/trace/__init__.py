"""Trace format v1 (docs/design.md §5): typed records, a streaming writer and a streaming reader.

with TraceWriter("run.jsonl.gz", {"source": "sim"}, truth={...}) as w:
    w.write(Sample(ts=t, name=signals.DCGM_FI_DEV_POWER_USAGE, value=312.5, node="n1"))
    w.write_samples(t, signals.DCGM_FI_DEV_GPU_TEMP, temps, columns)  # bulk, fast
for record in TraceReader("run.jsonl.gz"):  # dicts; .records() for typed
    ...
"""

from contract.trace.reader import (
    Problem,
    TraceReader,
    ValidationReport,
    open_trace_bytes,
    validate_trace,
)
from contract.trace.records import (
    FORMAT,
    IDENTITY_TYPES,
    RECORD_CLASSES,
    RECORD_TYPES,
    VERSION,
    Event,
    Exit,
    Job,
    Log,
    Process,
    Record,
    Sample,
    check_meta,
    check_record,
    from_dict,
)
from contract.trace.writer import SampleColumns, TraceError, TraceOrderError, TraceWriter

__all__ = [
    "FORMAT",
    "IDENTITY_TYPES",
    "RECORD_CLASSES",
    "RECORD_TYPES",
    "VERSION",
    "Event",
    "Exit",
    "Job",
    "Log",
    "Problem",
    "Process",
    "Record",
    "Sample",
    "SampleColumns",
    "TraceError",
    "TraceOrderError",
    "TraceReader",
    "TraceWriter",
    "ValidationReport",
    "check_meta",
    "check_record",
    "from_dict",
    "open_trace_bytes",
    "validate_trace",
]
