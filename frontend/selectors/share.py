"""Reads of the customer-facing verdict page (`/incidents/<id>/summary/`, and the page a share
link opens, `/share/<token>/`).

    verdict = customer_verdict(principal, public_id)   # Http404 across tenants and customers

The page is the verdict page's data (frontend/selectors/incidents.incident_detail: the same
evidence rows and chart specs) retold for the operator's customer: the operator's name, a
plain-language lead, the four checks, the evidence charts, the recommendation and the money at
stake — with no console links. When the operator has `mask_node_names` set, every hostname and
GPU UUID on the page (subject, evidence rows, notes, chart labels, the summary's text) is
replaced by a stable alias: "node-1", "gpu-1", numbered in the order the verdict names them
(its subject, then its evidence rows), then the job's other nodes and GPUs by name.

Queries: the operator row (skipped when the caller has it: a share link loads it), the verdict
page's reads, and, when masking, one for the job's nodes and GPUs.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Max
from django.utils import timezone

from frontend.selectors import incident_charts
from frontend.selectors.incidents import (
    ClearedCheck,
    IncidentDetail,
    Money,
    incident_detail,
    place_parts,
)
from ingest.models import JobRank, Process
from investigations.models import ShareLink
from tenants.access import Principal
from tenants.models import Operator, Role

# NVML's GPU and MIG UUIDs, wherever they appear in free text.
_GPU_UUID = re.compile(r"\b(?:GPU|MIG)-[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}\b")
# A chart line names a GPU without an index by its UUID's first 12 characters
# (incident_charts._line_label): masked as the GPU's alias too.
_GPU_SHORT = 12
CHECK_NAMES = {
    "hardware": "the GPUs and their hosts",
    "fabric": "the network fabric",
    "storage": "the storage",
    "job": "the job itself",
}


class Masker:
    """Stable aliases for hostnames and GPU UUIDs, applied to any JSON-like value."""

    def __init__(self, nodes: Iterable[str], gpus: Iterable[str]) -> None:
        self.aliases: dict[str, str] = {}
        self._gpus = 0
        node_count = 0
        for node in nodes:
            if node and node not in self.aliases:
                node_count += 1
                self.aliases[node] = f"node-{node_count}"
        for gpu in gpus:
            self._gpu_alias(gpu)
        self._pattern: re.Pattern[str] | None = None

    def _gpu_alias(self, gpu: str) -> str:
        if not gpu:
            return gpu
        if gpu not in self.aliases:
            self._gpus += 1
            self.aliases[gpu] = f"gpu-{self._gpus}"
            if len(gpu) > _GPU_SHORT:
                self.aliases.setdefault(gpu[:_GPU_SHORT], self.aliases[gpu])
            self._pattern = None
        return self.aliases[gpu]

    def _known(self) -> re.Pattern[str] | None:
        if self._pattern is None and self.aliases:
            # Longest first, so "node-10" is never read as "node-1" followed by "0"; a name
            # only where it stands alone (not inside a longer name or word).
            names = sorted(self.aliases, key=len, reverse=True)
            alternatives = "|".join(re.escape(n) for n in names)
            self._pattern = re.compile(rf"(?<![A-Za-z0-9_.-])(?:{alternatives})(?![A-Za-z0-9_-])")
        return self._pattern

    def text(self, value: str) -> str:
        value = _GPU_UUID.sub(lambda m: self._gpu_alias(m.group(0)), value)
        pattern = self._known()
        if pattern is None:
            return value
        return pattern.sub(lambda m: self.aliases[m.group(0)], value)

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value


@dataclass(frozen=True)
class CustomerVerdict:
    operator_name: str
    masked: bool
    detail: IncidentDetail  # the verdict page's data, unmasked: not for the template
    category: str
    family: str
    state: str
    title: str
    lead: str
    summary: str
    explanation: str
    recommendation: str
    job_id: str | None
    interval: tuple[float, float]
    slowdown_pct: float | None
    gpu_hours_lost: float | None
    money_lost: Money | None
    subject_place: list[dict[str, str]]
    evidence: list[incident_charts.EvidenceRow]
    cleared: list[ClearedCheck]

    @property
    def cleared_names(self) -> list[str]:
        return [CHECK_NAMES[c.check] for c in self.cleared if c.result == "clear"]


def _job_places(operator_id: int, job_pk: int | None) -> tuple[list[str], list[str]]:
    """The job's nodes and GPUs (its ranks' and processes'), by name, in one query."""
    if job_pk is None:
        return [], []
    ranks = JobRank.objects.for_tenant(operator_id).filter(job_id=job_pk)
    processes = Process.objects.for_tenant(operator_id).filter(job_id=job_pk)
    rows = ranks.values_list("node__hostname", "gpu").union(
        processes.values_list("node__hostname", "gpu")
    )
    nodes, gpus = set(), set()
    for node, gpu in rows:
        if node:
            nodes.add(str(node))
        if gpu:
            gpus.add(str(gpu))
    return sorted(nodes), sorted(gpus)


def _subject(verdict: Mapping[str, Any]) -> dict[str, Any]:
    subject = verdict.get("subject")
    return subject if isinstance(subject, dict) else {}


def _masker(operator_id: int, detail: IncidentDetail) -> Masker:
    verdict = detail.verdict
    subject = _subject(verdict)
    rows = [subject, *(row.evidence for row in detail.evidence)]
    named_nodes = [str(r.get("node") or "") for r in rows]
    named_gpus = [str(r.get("gpu") or "") for r in rows]
    job_nodes, job_gpus = _job_places(operator_id, detail.incident.job_id)
    nodes = [*named_nodes, detail.incident.subject_node, *job_nodes]
    gpus = [*named_gpus, detail.incident.subject_gpu, *job_gpus]
    return Masker(nodes, gpus)


def _lead(operator_name: str, category: str, cleared: list[ClearedCheck]) -> str:
    """One or two sentences a reader without Proof's vocabulary can act on."""
    clear = [CHECK_NAMES[c.check] for c in cleared if c.result == "clear"]
    implicated = [CHECK_NAMES[c.check] for c in cleared if c.result == "implicated"]
    if category == "job":
        lead = "The cause is in the job itself (its code, data or configuration)."
    elif category == "infrastructure":
        lead = f"The cause is in {operator_name}'s infrastructure, not in the job."
    else:
        lead = "Proof found a problem with this job."
    if clear:
        lead += f" Checked and cleared: {', '.join(clear)}."
    if implicated:
        lead += f" Implicated: {', '.join(implicated)}."
    return lead


def customer_verdict(
    principal: Principal, public_id: uuid.UUID, operator: Operator | None = None
) -> CustomerVerdict:
    """The customer-facing page's data (module doc). Another tenant's incident, or another
    customer's for a customer principal, is Http404."""
    if operator is None:
        operator = Operator.objects.only("name", "mask_node_names").get(pk=principal.operator_id)
    detail = incident_detail(principal, public_id)
    verdict, incident = detail.verdict, detail.incident
    evidence = detail.evidence
    cleared = detail.cleared
    subject = _subject(verdict)
    title = incident.title or incident.family
    if operator.mask_node_names:
        masker = _masker(operator.pk, detail)
        verdict = masker.value(verdict)
        subject = masker.value(subject)
        title = masker.text(title)
        evidence = [
            dataclasses.replace(
                row, evidence=masker.value(row.evidence), chart=masker.value(row.chart)
            )
            for row in evidence
        ]
        by_id = {str(row.evidence.get("id")): row.evidence for row in evidence}
        cleared = [
            ClearedCheck(
                c.check,
                c.result,
                masker.text(c.note),
                [by_id.get(str(e.get("id")), masker.value(e)) for e in c.evidence],
            )
            for c in cleared
        ]
    for row in evidence:
        # Where each row is, without the console's fleet links.
        row.place = place_parts(row.evidence, None)
    return CustomerVerdict(
        operator_name=operator.name,
        masked=operator.mask_node_names,
        detail=detail,
        category=incident.category,
        family=incident.family,
        state=incident.state,
        title=title,
        lead=_lead(operator.name, incident.category, cleared),
        summary=str(verdict.get("summary") or ""),
        explanation=str(verdict.get("explanation") or ""),
        recommendation=str(verdict.get("recommendation") or ""),
        job_id=detail.job_id,
        interval=detail.interval,
        slowdown_pct=detail.slowdown_pct,
        gpu_hours_lost=detail.gpu_hours_lost,
        money_lost=detail.money_lost,
        subject_place=place_parts(subject, None),
        evidence=evidence,
        cleared=cleared,
    )


# --- the summary page's share links (operator roles and customer admins) -------------------

SHARE_DURATIONS: tuple[tuple[int, str], ...] = (
    (3600, "1 hour"),
    (24 * 3600, "1 day"),
    (7 * 24 * 3600, "7 days"),
    (30 * 24 * 3600, "30 days"),
)


@dataclass(frozen=True)
class ShareLinkRow:
    id: int
    created_at: datetime
    expires_at: datetime
    expired: bool
    opens: int
    last_opened: datetime | None


def may_share(principal: Principal) -> bool:
    return principal.can_write and principal.role != Role.CUSTOMER_VIEWER


def share_links_of(principal: Principal, incident_pk: int) -> list[ShareLinkRow]:
    """The incident's live (not revoked) links with their open counts, newest first: one
    query. Empty for those who may not share."""
    if not may_share(principal):
        return []
    now = timezone.now()
    rows = (
        ShareLink.objects.for_tenant(principal)
        .filter(incident_id=incident_pk, revoked_at__isnull=True)
        .annotate(open_count=Count("opens"), last_opened=Max("opens__opened_at"))
        .order_by("-created_at", "-id")
        .values_list("pk", "created_at", "expires_at", "open_count", "last_opened")
    )
    return [
        ShareLinkRow(int(pk), created, expires, expires <= now, int(count), last)
        for pk, created, expires, count, last in rows
    ]
