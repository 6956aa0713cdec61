"""What ingest announces to the apps above it; ingest itself knows none of them.

`batch_stored` is sent by `ingest.services.store_batch()` inside the batch's transaction,
after everything of the batch is written and before it commits: a receiver's writes commit
with the batch or not at all (a receiver that raises rolls the batch back and ingest refuses
it, so the agent resends it), and work a receiver wants done after the commit belongs in
`transaction.on_commit`. Receivers must be quick: they hold the batch's transaction open.

Keyword arguments:
- `operator_id`: the tenant the batch was stored for;
- `job_spans`: job pk → (first, last) data time of the batch's records of that job, seconds;
- `node_spans`: node pk → (first, last) data time of samples that carry no job (e.g. GPU
  readings the agent could not attribute), seconds;
- `batch`: the stored `DecodedBatch` itself (read it, never change it), for receivers that
  look at what arrived without reading it back;
- `job_ids` / `node_ids`: job id / hostname → pk of the batch's jobs and nodes.

`job_state_changed` is sent inside the same transaction whenever storing moves a job to
another state (a job record saying so, or the last of its ranks exiting); receivers that act
outside the database (the console's live updates) defer to `transaction.on_commit`; as for
`batch_stored`, one that raises rolls the batch back.
Keyword arguments: `operator_id`, `job_pk`, `job_id` (the scheduler's id), `customer_id`
(None when unattributed), `state` (the new one) and `previous` (the old one).
"""

from __future__ import annotations

from django.dispatch import Signal

batch_stored = Signal()
job_state_changed = Signal()
