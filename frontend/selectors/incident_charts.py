"""The verdict page's evidence charts are built in investigations/evidence_charts.py, below the
frontend, so that the API's evidence series (GET /api/v1/incidents/<id>/evidence-series/) and
this page draw the same lines from the same reads; re-exported here for the page's selectors."""

from __future__ import annotations

from investigations.evidence_charts import MAX_POINTS as MAX_POINTS
from investigations.evidence_charts import EvidenceRow as EvidenceRow
from investigations.evidence_charts import _bucket as _bucket
from investigations.evidence_charts import _grid as _grid
from investigations.evidence_charts import _line_label as _line_label
from investigations.evidence_charts import chart_window as chart_window
from investigations.evidence_charts import evidence_rows as evidence_rows
