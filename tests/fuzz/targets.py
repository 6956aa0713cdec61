"""Fuzz targets (issue 16): each a function of arbitrary bytes that must either succeed or refuse
the input with the error its API documents (a clear message naming what was wrong). Any other
exception is a crash: the fuzzer stops and keeps the input (tests/fuzz/run.py).

- `batch`: wire bytes as ingest's servicer receives them — protobuf's parse (refusal:
  `DecodeError`, which the servicer answers "not a valid Batch"), then
  `ingest.processing.decode_batch` (refusal: `BatchRejected`), and the agent's dead-letter
  rendering of the same bytes, `contract.wire.decode.batch_records` (nothing raised).
- `trace`: a trace file (plain or gzip) through `contract.trace.TraceReader` — every problem is
  reported on its line, nothing raised.
- `parsers`: text through the log and metrics parsers — `contract.parsers.training.LogParser`
  and `parse_line`, `contract.parsers.kernel.parse_xid` / `split_prefix` / `gpu_announcement`,
  `contract.parsers.prometheus.parse_text` (refusal: `ParseError`).

Seeds are real fixtures: the real traces and logs in agent/tests/data/ (SOURCES.md has their
provenance) and the batches an agent builds from those traces (`seeds(name)`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "agent" / "tests" / "data"
MAX_SEED_BYTES = 64 * 1024  # libFuzzer's default -max_len is taken from the largest seed

_SCRATCH = Path(tempfile.gettempdir())


def _django() -> None:
    """ingest.processing reads its limits from the contract, not settings; importing it loads
    ingest.storage, which needs Django's settings to be configured (not a database)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proof_web.settings")
    import django

    django.setup()


def batch_target() -> Callable[[bytes], None]:
    _django()
    from google.protobuf.message import DecodeError

    from contract.wire import ingest_pb2
    from contract.wire.decode import batch_records
    from ingest.processing import BatchRejected, Limits, decode_batch

    limits = Limits()

    def one(data: bytes) -> None:
        try:
            # As ingest/server.py `_parse_batch`: a DecodeError is refused as "not a valid Batch".
            message = ingest_pb2.Batch.FromString(data)
        except DecodeError:
            return
        try:
            decode_batch(message, limits, size=len(data))
        except BatchRejected as exc:
            assert str(exc), "a refusal names what was wrong"
        batch_records(data)

    return one


def trace_target() -> Callable[[bytes], None]:
    from contract.trace import TraceReader

    path = _SCRATCH / f"proof-fuzz-trace-{os.getpid()}.jsonl"

    def one(data: bytes) -> None:
        path.write_bytes(data)
        reader = TraceReader(path)
        for _ in reader.dicts():
            pass
        assert reader.problem_count >= len(reader.problems)

    return one


def parsers_target() -> Callable[[bytes], None]:
    from contract.parsers import kernel, prometheus, training

    def one(data: bytes) -> None:
        text = data.decode("utf-8", errors="replace")
        parser = training.LogParser()
        for line in text.splitlines():
            parser.feed(line)
            training.parse_line(line)
            kernel.parse_xid(line)
            kernel.split_prefix(line)
            kernel.gpu_announcement(line)
        try:
            prometheus.parse_text(text)
        except prometheus.ParseError as exc:
            assert str(exc), "a refusal names what was wrong"

    return one


TARGETS: dict[str, Callable[[], Callable[[bytes], None]]] = {
    "batch": batch_target,
    "trace": trace_target,
    "parsers": parsers_target,
}


def _real_traces() -> list[Path]:
    return sorted((DATA / "real").glob("*/*.jsonl.gz"))


def _batch_seeds() -> Iterator[bytes]:
    """The batches an agent sends for the real traces: one per ten seconds of each, the first
    few of each trace."""
    from contract.trace import TraceReader
    from contract.wire.encode import BatchBuilder

    for path in _real_traces():
        builder = BatchBuilder(f"fuzz-{path.stem}")
        sequence = 0
        start: float | None = None
        for record in TraceReader(path).dicts():
            ts = float(record.get("ts", 0.0))
            start = ts if start is None else start
            if ts - start >= 10.0 and len(builder):
                sequence += 1
                yield builder.build(sequence).SerializeToString()
                start = ts
                if sequence >= 4:
                    break
            builder.add(record)


def seeds(name: str) -> Iterator[bytes]:
    """Seed inputs for target `name`, each at most MAX_SEED_BYTES."""
    if name == "batch":
        found: Iterator[bytes] = _batch_seeds()
    elif name == "trace":
        found = (p.read_bytes() for p in _real_traces())
    else:
        texts = [*DATA.glob("training/*.log"), *DATA.glob("xid/*.log"), *DATA.glob("nccl/*.log")]
        texts += [*DATA.glob("dcgm/*.prom"), *DATA.glob("vllm/*.prom")]
        texts += [*DATA.glob("deepspeed/*.log")]
        found = (p.read_bytes() for p in sorted(texts))
    for data in found:
        yield data[:MAX_SEED_BYTES]
