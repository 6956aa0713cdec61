"""What investigations' services announce; investigations.tasks answers with the task.

`evaluation_due` is sent by `services.schedule_job_evaluation()` after the commit that stored
new data for a job (debounced by `services.note_job_data`): the job needs an evaluation in
`countdown` seconds. `investigations.tasks` connects it to `evaluate_job.apply_async`, so the
services, which the tasks call, never import the tasks. Where the task then runs is the Celery
configuration chosen at startup (proof_web/settings.py): the broker's workers in production,
the in-process runner's workers in the embedded default (proof_web/runner.py).

Keyword arguments: `operator_id`, `job_pk`, `countdown` (seconds).
"""

from __future__ import annotations

from django.dispatch import Signal

evaluation_due = Signal()
