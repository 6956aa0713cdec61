"""Ingest's storage: inventory (nodes, GPUs, jobs and their ranks, processes), the series
catalog, rollups, logs, events and the batch receipts that make ingestion idempotent.

Samples themselves are not an ORM model: they live in the raw-SQL table `ingest_sample_block`
(migration 0002, ingest/storage.py), one row per node per batch holding the batch's samples of
all that node's series, compressed; on PostgreSQL it is partitioned by time.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from tenants.models import (
    AgentToken,
    Customer,
    TenantOwned,
    operator_index,
    unique_per_operator,
)


class Node(TenantOwned):
    hostname = models.CharField(max_length=255)
    agent_id = models.CharField(max_length=128, blank=True, default="")
    agent_version = models.CharField(max_length=64, blank=True, default="")
    registered_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # The agent token the node's agent last registered with: which nodes a token serves (the
    # settings' agents page), and so what revoking it cuts off.
    agent_token = models.ForeignKey(
        AgentToken, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        constraints = [unique_per_operator("hostname", name="ingest_node_unique")]

    def __str__(self) -> str:
        return self.hostname


class Gpu(TenantOwned):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    uuid = models.CharField(max_length=96)
    index = models.IntegerField(null=True, blank=True)
    model = models.CharField(max_length=128, blank=True, default="")
    memory_mib = models.BigIntegerField(null=True, blank=True)
    driver_version = models.CharField(max_length=64, blank=True, default="")
    cuda_version = models.CharField(max_length=64, blank=True, default="")
    last_seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [unique_per_operator("uuid", name="ingest_gpu_unique")]

    def __str__(self) -> str:
        return self.uuid


class JobState(models.TextChoices):
    UNKNOWN = "unknown", "Unknown"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


# A job in one of these states has ended; nothing moves it out of them but a new job record.
TERMINAL_JOB_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


class Job(TenantOwned):
    """A scheduler job (Slurm job, Kubernetes pod, torchrun run), attributed to a customer by
    the operator's mapping rules when first seen."""

    job_id = models.CharField(max_length=255)
    customer = models.ForeignKey(
        Customer, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    kind = models.CharField(max_length=32, blank=True, default="")
    name = models.CharField(max_length=255, blank=True, default="")
    scheduler = models.CharField(max_length=64, blank=True, default="")
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.UNKNOWN)
    world_size = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    nodes = models.JSONField(default=list, blank=True)
    config = models.JSONField(null=True, blank=True)
    attributes = models.JSONField(default=dict, blank=True)
    rerun_of = models.CharField(max_length=255, blank=True, default="")
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    customer_path: ClassVar[str | None] = "customer"

    class Meta:
        constraints = [unique_per_operator("job_id", name="ingest_job_unique")]

    def __str__(self) -> str:
        return self.job_id


class JobRank(TenantOwned):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="ranks")
    rank = models.IntegerField()
    local_rank = models.IntegerField(null=True, blank=True)
    node = models.ForeignKey(Node, on_delete=models.SET_NULL, null=True, blank=True)
    gpu = models.CharField(max_length=96, blank=True, default="")
    pid = models.BigIntegerField(null=True, blank=True)

    customer_path: ClassVar[str | None] = "job__customer"

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "rank"], name="ingest_rank_unique")]


class Process(TenantOwned):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="processes")
    pid = models.BigIntegerField()
    job = models.ForeignKey(Job, on_delete=models.SET_NULL, null=True, blank=True)
    rank = models.IntegerField(null=True, blank=True)
    local_rank = models.IntegerField(null=True, blank=True)
    world_size = models.IntegerField(null=True, blank=True)
    gpu = models.CharField(max_length=96, blank=True, default="")
    cmd = models.TextField(blank=True, default="")
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    exit_code = models.IntegerField(null=True, blank=True)
    exited_at = models.DateTimeField(null=True, blank=True)

    customer_path: ClassVar[str | None] = "job__customer"

    class Meta:
        constraints = [unique_per_operator("node", "pid", name="ingest_process_unique")]
        indexes = [
            # The console's job list sorts by each job's distinct nodes (a count over its
            # processes, for every job of the operator): an index-only scan of this, not a heap
            # read per process. operator_id is in it for the row-level-security filter.
            models.Index(fields=["job", "node", "operator"], name="ingest_process_job_nodes")
        ]


class Sourced(TenantOwned):
    """Base of what agents report about one place (a series, an event): the node, GPU,
    process and job rank it came from, each optional; customers see it through the job."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, null=True, blank=True)
    gpu = models.CharField(max_length=96, blank=True, default="")
    gpu_index = models.IntegerField(null=True, blank=True)
    pid = models.BigIntegerField(null=True, blank=True)
    job = models.ForeignKey(Job, on_delete=models.SET_NULL, null=True, blank=True)
    rank = models.IntegerField(null=True, blank=True)

    customer_path: ClassVar[str | None] = "job__customer"

    class Meta:
        abstract = True


class Series(Sourced):
    """One time series: a signal name with its identity keys and labels (docs/design.md §3–4).

    `key_hash` digests the whole identity so that the catalog lookup is one indexed equality.
    `step` is deliberately not part of a series' identity (it changes every iteration).
    """

    key_hash = models.CharField(max_length=32)
    name = models.CharField(max_length=255)
    local_rank = models.IntegerField(null=True, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [unique_per_operator("key_hash", name="ingest_series_unique")]
        indexes = [
            operator_index("job", name="ingest_series_job"),
            operator_index("node", "name", name="ingest_series_node"),
            operator_index("gpu", "name", name="ingest_series_gpu"),
        ]


class SeriesRollup(TenantOwned):
    """Per-series hourly summary, for long ranges (a GPU's counters over 30 days)."""

    series = models.ForeignKey(Series, on_delete=models.CASCADE, related_name="rollups")
    bucket_start_ms = models.BigIntegerField()
    count = models.IntegerField()
    min = models.FloatField()
    max = models.FloatField()
    sum = models.FloatField()
    first = models.FloatField()
    last = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["series", "bucket_start_ms"], name="ingest_rollup_unique"
            )
        ]
        # One hour of the whole fleet at once (the console's idle-while-holding-memory scan
        # reads the newest bucket of every GPU) without probing each series.
        indexes = [operator_index("bucket_start_ms", name="ingest_rollup_bucket")]


class LogLine(TenantOwned):
    ts_us = models.BigIntegerField()
    node = models.ForeignKey(Node, on_delete=models.CASCADE, null=True, blank=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, null=True, blank=True)
    pid = models.BigIntegerField(null=True, blank=True)
    rank = models.IntegerField(null=True, blank=True)
    step = models.BigIntegerField(null=True, blank=True)
    stream = models.CharField(max_length=16, blank=True, default="")
    line = models.TextField()

    customer_path: ClassVar[str | None] = "job__customer"

    class Meta:
        indexes = [
            operator_index("job", "ts_us", name="ingest_log_job_ts"),
            operator_index("node", "ts_us", name="ingest_log_node_ts"),
        ]


class Event(Sourced):
    ts_us = models.BigIntegerField()
    name = models.CharField(max_length=128)
    value = models.FloatField(null=True, blank=True)
    text = models.TextField(blank=True, default="")
    labels = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            operator_index("gpu", "ts_us", name="ingest_event_gpu_ts"),
            operator_index("node", "ts_us", name="ingest_event_node_ts"),
        ]


class BatchReceipt(TenantOwned):
    """One row per stored batch; its unique key makes a resent batch a no-op. Written in the
    same transaction as the batch's data, so "receipt exists" ⇔ "data committed"."""

    agent_id = models.CharField(max_length=128)
    sequence = models.BigIntegerField()
    samples = models.IntegerField(default=0)
    received_at = models.DateTimeField()

    class Meta:
        constraints = [unique_per_operator("agent_id", "sequence", name="ingest_receipt_unique")]
