"""The block read path (ingest/selectors.py): many small blocks decoded on the pool node by
node give exactly what decoding them on the caller's thread gives, and the pool's CPU for a
thread's reads is counted to that thread (caller_pool_cpu_s)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ingest import selectors, services
from ingest.processing import Limits, decode_batch
from ingest.tests.helpers import gpu_batch
from tenants.context import tenant_context
from tenants.testing import make_tenant

pytestmark = pytest.mark.django_db

NODES = 3
SECONDS = 40  # 3 nodes × 40 one-second blocks: past DECODE_CHUNK, so the pool decodes them


def _store_one_second_batches(operator_id: int, start: float) -> None:
    limits = Limits()
    for node in range(NODES):
        for second in range(SECONDS):
            batch = gpu_batch(
                agent_id=f"agent-{node}",
                sequence=second + 1,
                node=f"node-{node}",
                gpus=2,
                seconds=1,
                start=start + second,
            )
            services.store_batch(operator_id, decode_batch(batch, limits))


def _read(operator_id: int, start: float) -> dict[str, tuple[bytes, bytes]]:
    with tenant_context(operator_id):
        data = selectors.job_series(operator_id, "job-1", start, start + SECONDS)
    return {repr(s.info): (s.ts.tobytes(), s.values.tobytes()) for s in data}


def test_pool_and_caller_decode_alike_and_the_pool_cpu_is_the_caller_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    services.clear_caches()
    operator_id = make_tenant("read-pool").operator.pk
    start = float(int(time.time()) - 200)
    _store_one_second_batches(operator_id, start)
    other_thread_before: list[float] = []
    seen = threading.Event()

    def other_thread() -> None:  # a thread that reads nothing sees none of the pool's CPU
        other_thread_before.append(selectors.caller_pool_cpu_s())
        seen.wait(30)
        other_thread_before.append(selectors.caller_pool_cpu_s())

    watcher = threading.Thread(target=other_thread)
    watcher.start()
    mine, process = selectors.caller_pool_cpu_s(), selectors.pool_decode_cpu_s()
    on_pool = _read(operator_id, start)
    spent = selectors.caller_pool_cpu_s() - mine
    seen.set()
    watcher.join()
    assert spent > 0
    assert spent == pytest.approx(selectors.pool_decode_cpu_s() - process)
    assert other_thread_before == [0.0, 0.0]
    monkeypatch.setattr(selectors, "DECODE_CHUNK", 10_000)  # every block on this thread
    mine = selectors.caller_pool_cpu_s()
    assert _read(operator_id, start) == on_pool
    assert selectors.caller_pool_cpu_s() == mine
    # 3 nodes × 2 GPUs × 2 signals, each one sample a second: all of them, in time order.
    assert len(on_pool) == NODES * 2 * 2
    for ts, _values in on_pool.values():
        np.testing.assert_array_equal(
            np.frombuffer(ts), start + np.arange(SECONDS, dtype=np.float64)
        )
