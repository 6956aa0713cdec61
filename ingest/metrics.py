"""The ingest server's own Prometheus metrics (served on --metrics-port)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

BATCHES = Counter("proof_ingest_batches_total", "Batches processed, by outcome", ["status"])
SAMPLES = Counter("proof_ingest_samples_total", "Samples stored (duplicates not counted)")
RECORDS = Counter("proof_ingest_records_total", "Logs, events, process, exit and job records")
REJECTS = Counter("proof_ingest_rejects_total", "Batches refused, by reason", ["reason"])
RECORD_REJECTS = Counter(
    "proof_ingest_record_rejects_total",
    "Records refused alone (the rest of their batch stored), by kind and reason",
    ["kind", "reason"],
)
REJECTED_SAMPLES = Counter(
    "proof_ingest_rejected_samples_total",
    "Samples refused (of refused series, non-finite, outside the accepted window)",
)
STORE_ERRORS = Counter(
    "proof_ingest_store_errors_total", "Batches whose storage failed (not acked; agents resend)"
)
STORE_RETRIES = Counter(
    "proof_ingest_store_retries_total",
    "Batch transactions aborted for a conflict with a concurrent one (deadlock, serialization "
    "failure) and stored again by the writer",
)
ACK_LATENCY = Histogram(
    "proof_ingest_ack_latency_seconds",
    "From a batch's arrival to its ack (validation, queueing, storage, commit)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
QUEUE_DEPTH = Gauge("proof_ingest_queue_depth", "Batches waiting for the storage writer")
STREAMS = Gauge("proof_ingest_streams", "Agent streams open")
AUTH_FAILURES = Counter("proof_ingest_auth_failures_total", "Calls refused as UNAUTHENTICATED")
