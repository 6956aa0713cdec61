"""BatchBuilder: batches put together from cached serialized parts decode on their own, to
exactly the samples and records added, across the string/series cache's generations."""

from __future__ import annotations

from typing import Any

import numpy as np

from contract import signals
from contract.wire import ingest_pb2
from contract.wire.encode import BatchBuilder


def _decode(data: bytes) -> tuple[Any, dict[tuple[Any, ...], list[tuple[int, float]]]]:
    batch = ingest_pb2.Batch.FromString(data)
    s = batch.strings
    assert s[0] == ""
    ts = np.cumsum(np.array(batch.ts_ms, dtype=np.int64)).tolist()
    values = list(batch.values)
    assert sum(batch.sample_counts) == len(ts) == len(values)
    out: dict[tuple[Any, ...], list[tuple[int, float]]] = {}
    at = 0
    for sd, count in zip(batch.series, batch.sample_counts, strict=True):
        i = sd.identity
        key = (
            s[sd.name],
            s[i.node],
            s[i.gpu],
            i.gpu_index if i.HasField("gpu_index") else None,
            i.pid if i.HasField("pid") else None,
            tuple(s[x] for x in sd.labels),
        )
        assert key not in out, "a series appears once per batch"
        assert count > 0, "only series with samples this batch are listed"
        out[key] = list(zip(ts[at : at + count], values[at : at + count], strict=True))
        at += count
    return batch, out


def _sample(name: str, ts: float, value: float, **extra: Any) -> dict[str, Any]:
    return {"type": "sample", "ts": ts, "name": name, "value": value, **extra}


def test_batches_are_self_contained_across_generations() -> None:
    builder = BatchBuilder("agent-1", generation_batches=2)
    decoded = []
    for second in range(5):
        t = 1_700_000_000.0 + second
        builder.add(_sample("gpu.util", t, 50.0 + second, node="n1", gpu="GPU-a", gpu_index=0))
        builder.add(
            _sample("gpu.util", t + 0.5, 51.0 + second, node="n1", gpu="GPU-a", gpu_index=0)
        )
        # a series that exists only in the first second (an exited process)
        if second == 0:
            builder.add(_sample("cuda.launches", t, 7, node="n1", pid=4242))
        builder.add(_sample("nccl.calls", t, 3, node="n1", pid=1, labels={"op": "allreduce"}))
        builder.add(_sample("gpu.temp", t, float("nan"), node="n1", gpu="GPU-a"))
        builder.add({"type": "event", "ts": t, "name": "collector_error", "text": "x"})
        data = builder.build_bytes(second + 1)
        decoded.append(_decode(data))
    assert builder.dropped == 5
    for second, (batch, series) in enumerate(decoded):
        t_ms = 1_700_000_000_000 + 1000 * second
        assert batch.agent_id == "agent-1"
        assert batch.sequence == second + 1
        assert series[("gpu.util", "n1", "GPU-a", 0, None, ())] == [
            (t_ms, 50.0 + second),
            (t_ms + 500, 51.0 + second),
        ]
        assert series[("nccl.calls", "n1", "", None, 1, ("op", "allreduce"))] == [(t_ms, 3.0)]
        exited = ("cuda.launches", "n1", "", None, 4242, ())
        assert (series.get(exited) == [(t_ms, 7.0)]) == (second == 0)
        assert len(series) == (3 if second == 0 else 2)
        assert [batch.strings[e.name] for e in batch.events] == ["collector_error"]
    # The generation ended after two batches: its strings are not carried any further.
    assert "cuda.launches" in decoded[1][0].strings
    assert "cuda.launches" not in decoded[2][0].strings


def test_build_returns_the_same_batch_as_a_message() -> None:
    builder = BatchBuilder("agent-2")
    builder.add(_sample("host.cpu", 10.0, 1.5, node="n"))
    builder.add_samples(
        "gpu.power", {"node": "n", "gpu": "G"}, np.array([10.0, 11.0]), np.array([1.0, 2.0])
    )
    builder.add({"type": "log", "ts": 10.0, "line": "hello", "stream": "stdout", "node": "n"})
    batch = builder.build(7)
    assert batch.sequence == 7 and batch.agent_id == "agent-2"
    assert list(batch.sample_counts) == [1, 2]
    assert list(batch.values) == [1.5, 1.0, 2.0]
    assert [batch.strings[sd.name] for sd in batch.series] == ["host.cpu", "gpu.power"]
    assert batch.logs[0].line == "hello" and batch.strings[batch.logs[0].stream] == "stdout"
    assert len(builder) == 0
    # An empty builder still makes a valid (empty) batch.
    empty = builder.build(8)
    assert empty.sequence == 8 and not empty.series and not empty.ts_ms


def test_step_is_not_part_of_a_series_and_stays_off_its_def() -> None:
    builder = BatchBuilder("agent-3")
    for step in (1, 2):
        builder.add(
            _sample("train.loss", 5.0 + step, 2.0, node="n", rank=0, **{signals.STEP: step})
        )
    batch = builder.build(1)
    assert list(batch.sample_counts) == [2]
    assert not batch.series[0].identity.HasField("step")


def test_plain_python_columns_equal_the_numpy_columns() -> None:
    """The agent's path (samples added one by one, no numpy) puts the same series, counts,
    millisecond deltas and values on the wire as the numpy path add_samples takes."""
    builder = BatchBuilder("agent-4")
    t0 = 1_700_000_000
    for i in range(600):
        # interleaved series, integer and float ts, half-millisecond ties (round half to even)
        ts = t0 + i // 7 + (0.0005 if i % 5 == 0 else 0.0015 * (i % 3))
        builder.add(
            _sample(f"s{i % 37}", ts if i % 4 else int(ts), float(i), node="n", gpu_index=i % 8)
        )
    plain, vectorised = ingest_pb2.Batch(), ingest_pb2.Batch()
    assert builder._columns(plain) == builder._columns_numpy(vectorised)
    assert plain == vectorised
    assert sum(plain.sample_counts) == 600 and len(plain.sample_counts) == len(
        {(i % 37, i % 8) for i in range(600)}
    )
    # ...and the ts deltas decode back to the milliseconds added, series by series
    ts_ms = np.cumsum(np.array(plain.ts_ms, dtype=np.int64))
    assert ts_ms.min() == t0 * 1000 and ts_ms.max() <= (t0 + 600 // 7 + 1) * 1000
