"""What investigations does when the apps below it announce something (ingest/signals.py).

Connected once in InvestigationsConfig.ready(); ingest never imports investigations.
"""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from ingest.signals import batch_stored
from investigations import services


@receiver(batch_stored, dispatch_uid="investigations.note_job_data")
def note_stored_batch(
    sender: Any,
    *,
    operator_id: int,
    job_spans: dict[int, tuple[float, float]],
    node_spans: dict[int, tuple[float, float]],
    **kwargs: Any,
) -> None:
    """Record the jobs' data activity with the batch and schedule their evaluation."""
    services.note_job_data(operator_id, job_spans, node_spans)
