"""Verdicts written to be pasted into a ticket: `?format=markdown` (text/markdown) and
`?format=text` (text/plain) of GET /api/v1/verdicts/<id>/ (and of the list, one verdict after
another).

Each rendering says, in this order: the title; whose problem it is (JOB or INFRASTRUCTURE, in
capitals: the first thing a support engineer answers with); the summary; the recommendation;
the impact (slowdown, GPU-hours lost); the confidence; the evidence table (signal, GPU, rank,
node, interval, value — observed against its baseline); what was checked and cleared; and the
link to the verdict page. Times are UTC (ISO 8601, to the second): a ticket is read by people
in other time zones. Markdown table cells escape `|` so a note never breaks the table.

Errors are never rendered here: the verdict view answers them in the API's one JSON shape
whatever the format asked (a line of text stands in should one reach a renderer anyway).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from rest_framework.renderers import BaseRenderer

EVIDENCE_COLUMNS = ("Signal", "GPU", "Rank", "Node", "Interval (UTC)", "Value")


def verdict_page_url(verdict_id: str) -> str:
    return f"{str(settings.PROOF_PUBLIC_URL).rstrip('/')}/incidents/{verdict_id}/"


def _time(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "?"
    return datetime.fromtimestamp(float(value), UTC).strftime("%Y-%m-%d %H:%M:%S")


def interval_text(interval: object) -> str:
    if not isinstance(interval, Mapping):
        return ""
    start, end = interval.get("start"), interval.get("end")
    if start == end:
        return _time(start)
    first, last = _time(start), _time(end)
    # The same day twice says nothing: the end keeps its time only.
    if first[:10] == last[:10]:
        last = last[11:]
    return f"{first} – {last}"


def _number(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def value_text(row: Mapping[str, Any]) -> str:
    observed, baseline = _number(row.get("observed")), _number(row.get("baseline"))
    return f"{observed} (baseline {baseline})" if baseline else observed


def evidence_cells(row: Mapping[str, Any]) -> list[str]:
    note = str(row.get("note") or "")
    signal = str(row.get("signal") or "")
    return [
        f"{signal} — {note}" if note else signal,
        str(row.get("gpu") or ""),
        "" if row.get("rank") is None else str(row.get("rank")),
        str(row.get("node") or ""),
        interval_text(row.get("interval")),
        value_text(row),
    ]


def _impact(verdict: Mapping[str, Any]) -> str:
    impact = verdict.get("impact") if isinstance(verdict.get("impact"), Mapping) else {}
    parts = []
    slowdown = impact.get("slowdown_pct") if impact else None
    lost = impact.get("gpu_hours_lost") if impact else None
    if isinstance(slowdown, int | float) and not isinstance(slowdown, bool):
        parts.append(f"{slowdown:.1f}% slower")
    if isinstance(lost, int | float) and not isinstance(lost, bool):
        parts.append(f"{lost:.2f} GPU-hours lost")
    return ", ".join(parts) or "not stated"


def _confidence(verdict: Mapping[str, Any]) -> str:
    value = verdict.get("confidence")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{round(float(value) * 100)}%"
    return "not stated"


def _subject(verdict: Mapping[str, Any]) -> str:
    subject = verdict.get("subject") if isinstance(verdict.get("subject"), Mapping) else {}
    names = ("job", "node", "gpu", "rank", "mount")
    parts = [f"{n} {subject[n]}" for n in names if subject and subject.get(n) is not None]
    return ", ".join(parts)


def _rows(verdict: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    rows = verdict.get(key)
    return [r for r in rows if isinstance(r, Mapping)] if isinstance(rows, list) else []


def _cleared_line(check: Mapping[str, Any]) -> str:
    note = str(check.get("note") or "")
    cited = ", ".join(str(e) for e in check.get("evidence") or [])
    line = f"{check.get('check')}: {check.get('result')}"
    if note:
        line += f" — {note}"
    if cited:
        line += f" (evidence {cited})"
    return line


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def verdict_markdown(verdict: Mapping[str, Any]) -> str:
    category = str(verdict.get("category") or "").upper() or "UNKNOWN"
    lines = [
        f"### {verdict.get('title') or verdict.get('family')}",
        "",
        f"**{category}** · {verdict.get('family')} · confidence {_confidence(verdict)}",
    ]
    subject = _subject(verdict)
    if subject:
        lines.append(f"Subject: {subject} · {interval_text(verdict.get('interval'))} UTC")
    lines += [
        "",
        f"**Summary:** {verdict.get('summary') or ''}",
        "",
        f"**Recommendation:** {verdict.get('recommendation') or ''}",
        "",
        f"**Impact:** {_impact(verdict)}",
        "",
        f"**Confidence:** {_confidence(verdict)}",
        "",
        "**Evidence**",
        "",
    ]
    evidence = _rows(verdict, "evidence")
    if evidence:
        lines.append("| " + " | ".join(EVIDENCE_COLUMNS) + " |")
        lines.append("|" + "---|" * len(EVIDENCE_COLUMNS))
        for row in evidence:
            lines.append("| " + " | ".join(_cell(c) for c in evidence_cells(row)) + " |")
    else:
        lines.append("(none)")
    lines += ["", "**Checked and cleared**", ""]
    cleared = _rows(verdict, "cleared")
    lines += [f"- {_cleared_line(c)}" for c in cleared] or ["- (nothing checked)"]
    lines += ["", f"Verdict page: {verdict_page_url(str(verdict.get('id') or ''))}", ""]
    return "\n".join(lines)


def verdict_text(verdict: Mapping[str, Any]) -> str:
    category = str(verdict.get("category") or "").upper() or "UNKNOWN"
    title = str(verdict.get("title") or verdict.get("family"))
    lines = [
        title,
        "=" * min(len(title), 78),
        f"{category} - {verdict.get('family')} - confidence {_confidence(verdict)}",
    ]
    subject = _subject(verdict)
    if subject:
        lines.append(f"Subject: {subject}, {interval_text(verdict.get('interval'))} UTC")
    lines += [
        "",
        f"Summary: {verdict.get('summary') or ''}",
        f"Recommendation: {verdict.get('recommendation') or ''}",
        f"Impact: {_impact(verdict)}",
        f"Confidence: {_confidence(verdict)}",
        "",
        "Evidence:",
    ]
    evidence = [evidence_cells(row) for row in _rows(verdict, "evidence")]
    if evidence:
        table = [list(EVIDENCE_COLUMNS), *evidence]
        widths = [max(len(r[i]) for r in table) for i in range(len(EVIDENCE_COLUMNS))]
        for r in table:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    else:
        lines.append("  (none)")
    lines += ["", "Checked and cleared:"]
    lines += [f"  - {_cleared_line(c)}" for c in _rows(verdict, "cleared")] or [
        "  - (nothing checked)"
    ]
    lines += ["", f"Verdict page: {verdict_page_url(str(verdict.get('id') or ''))}", ""]
    return "\n".join(lines)


def _verdicts(data: Any) -> list[Mapping[str, Any]]:
    """The verdicts in a response body: one, a list, or a page of them."""
    if isinstance(data, Mapping) and isinstance(data.get("results"), list):
        data = data["results"]
    if isinstance(data, list):
        return [v for v in data if isinstance(v, Mapping)]
    return [data] if isinstance(data, Mapping) else []


def _error_line(data: Any, status_code: int) -> str:
    error = data.get("error") if isinstance(data, Mapping) else None
    if isinstance(error, Mapping):
        return f"Error {status_code}: {error.get('message') or ''}\n"
    detail = data.get("detail") if isinstance(data, Mapping) else data
    return f"Error {status_code}: {detail}\n"


class _VerdictRenderer(BaseRenderer):
    charset = "utf-8"
    separator = "\n"

    def one(self, verdict: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        response = (renderer_context or {}).get("response")
        status_code = getattr(response, "status_code", 200)
        if data is None:
            return b""
        if status_code >= 400:
            return _error_line(data, status_code).encode(self.charset)
        text = self.separator.join(self.one(v) for v in _verdicts(data))
        following = data.get("next") if isinstance(data, Mapping) else None
        if following:
            # A page of the list: where the rest is, as the JSON's `next` says.
            text += f"{self.separator}Next page: {following}\n"
        return text.encode(self.charset)


class VerdictMarkdownRenderer(_VerdictRenderer):
    media_type = "text/markdown"
    format = "markdown"
    separator = "\n---\n\n"

    def one(self, verdict: Mapping[str, Any]) -> str:
        return verdict_markdown(verdict)


class VerdictTextRenderer(_VerdictRenderer):
    media_type = "text/plain"
    format = "text"
    separator = "\n" + "-" * 78 + "\n\n"

    def one(self, verdict: Mapping[str, Any]) -> str:
        return verdict_text(verdict)
