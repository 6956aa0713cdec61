"""What each channel kind receives: the message built from an outbox row's payload.

The payload (written with the row, notify/services.py `payload_for`) holds the verdict JSON
(docs/design.md §7) and what the messages add to it: the notification kind, the verdict page's
URL and the money lost. Every builder is a pure function of the payload, so a retry sends the
same message (a webhook's timestamp and signature are per attempt, as the spec wants).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# Slack's limits (api.slack.com/reference/block-kit/blocks): 50 blocks a message, 3,000
# characters of section text, 150 of header text, 2,000 of a context element.
SLACK_MAX_BLOCKS = 50
SLACK_SECTION_CHARS = 3000
SLACK_HEADER_CHARS = 150
SLACK_CONTEXT_CHARS = 2000
# Evidence rows shown in chat: the top few, the verdict page has them all.
TOP_EVIDENCE = 5
# PagerDuty's payload.summary is at most 1,024 characters.
PAGERDUTY_SUMMARY_CHARS = 1024


@dataclass(frozen=True)
class HttpMessage:
    url: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def truncate(text: str, limit: int) -> str:
    """At most `limit` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def _verdict(payload: dict[str, Any]) -> dict[str, Any]:
    verdict: dict[str, Any] = payload.get("verdict") or {}
    return verdict


def title(payload: dict[str, Any]) -> str:
    verdict = _verdict(payload)
    text = str(verdict.get("title") or verdict.get("family") or "Verdict")
    if payload.get("kind") == "changed":
        text = f"Changed: {text}"
    elif payload.get("kind") == "test":
        text = f"Test: {text}"
    return text


def subject_line(payload: dict[str, Any]) -> str:
    subject = _verdict(payload).get("subject") or {}
    parts = [
        f"{name} {subject[key]}"
        for key, name in (("job", "job"), ("node", "node"), ("gpu", "GPU"), ("rank", "rank"))
        if subject.get(key) not in (None, "")
    ]
    return ", ".join(parts) or "fleet"


def impact_line(payload: dict[str, Any]) -> str:
    impact = _verdict(payload).get("impact") or {}
    parts = []
    if impact.get("gpu_hours_lost") is not None:
        parts.append(f"{float(impact['gpu_hours_lost']):.2f} GPU-hours lost")
    if payload.get("money_lost") is not None:
        parts.append(f"{payload['money_lost']} {payload.get('currency') or 'USD'} lost")
    if impact.get("slowdown_pct") is not None:
        parts.append(f"{float(impact['slowdown_pct']):.0f}% slower")
    return ", ".join(parts) or "not measured"


def evidence_lines(payload: dict[str, Any], limit: int = TOP_EVIDENCE) -> list[str]:
    lines = []
    for row in (_verdict(payload).get("evidence") or [])[:limit]:
        where = " ".join(
            f"{k} {row[k]}" for k in ("node", "gpu", "rank") if row.get(k) not in (None, "")
        )
        observed = row.get("observed")
        baseline = row.get("baseline")
        value = f"{observed}" + (f" (baseline {baseline})" if baseline is not None else "")
        note = row.get("note") or ""
        head = f"{row.get('signal', '?')} {where}".strip()
        lines.append(f"{head}: {value} {note}".strip())
    return lines


# --- Slack: an incoming webhook with Block Kit ---------------------------------------------------


def _mrkdwn_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_blocks(payload: dict[str, Any]) -> list[dict[str, Any]]:
    verdict = _verdict(payload)
    fields = [
        ("Category", str(verdict.get("category") or "?")),
        ("Family", str(verdict.get("family") or "?")),
        ("Subject", subject_line(payload)),
        ("Impact", impact_line(payload)),
    ]
    blocks: list[dict[str, Any]] = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": truncate(title(payload), SLACK_HEADER_CHARS)},
        },
        {
            "type": "section",
            "fields": [
                {
                    "type": "mrkdwn",
                    # A field's text is at most 2,000 characters.
                    "text": truncate(f"*{name}*\n{_mrkdwn_escape(value)}", 2000),
                }
                for name, value in fields
            ],
        },
    ]
    summary = str(verdict.get("summary") or "")
    if summary:
        blocks.append(_section(summary))
    evidence = evidence_lines(payload)
    if evidence:
        # Each row cut to its share of the section, so a long note never hides the rows after it.
        share = SLACK_SECTION_CHARS // len(evidence) - 40
        rows = "\n".join(f"• {truncate(e, share)}" for e in evidence)
        blocks.append(_section(f"*Top evidence*\n{rows}"))
    recommendation = str(verdict.get("recommendation") or "")
    if recommendation:
        blocks.append(_section(f"*Recommendation*\n{recommendation}"))
    if payload.get("url"):
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "Open the verdict"},
                        "url": truncate(str(payload["url"]), 3000),
                        "style": "primary",
                    }
                ],
            }
        )
    return blocks[:SLACK_MAX_BLOCKS]


def _section(text: str) -> dict[str, Any]:
    # Escaped first, truncated second: the cut can never split an entity into raw '&'.
    return {
        "type": "section",
        "text": {"type": "mrkdwn", "text": truncate(_mrkdwn_escape(text), SLACK_SECTION_CHARS)},
    }


def slack(url: str, payload: dict[str, Any]) -> HttpMessage:
    body = {
        # The notification's plain text (phones, screen readers) beside the blocks.
        "text": truncate(f"{title(payload)} — {subject_line(payload)}", SLACK_SECTION_CHARS),
        "blocks": slack_blocks(payload),
    }
    return HttpMessage(url, _json(body), {"Content-Type": "application/json"})


# --- Microsoft Teams: an incoming webhook with an Adaptive Card --------------------------------


def adaptive_card(payload: dict[str, Any]) -> dict[str, Any]:
    verdict = _verdict(payload)
    body: list[dict[str, Any]] = [
        {
            "type": "TextBlock",
            "text": title(payload),
            "weight": "Bolder",
            "size": "Large",
            "wrap": True,
        },
        {
            "type": "FactSet",
            "facts": [
                {"title": "Category", "value": str(verdict.get("category") or "?")},
                {"title": "Family", "value": str(verdict.get("family") or "?")},
                {"title": "Subject", "value": subject_line(payload)},
                {"title": "Impact", "value": impact_line(payload)},
            ],
        },
    ]
    if verdict.get("summary"):
        body.append({"type": "TextBlock", "text": str(verdict["summary"]), "wrap": True})
    evidence = evidence_lines(payload)
    if evidence:
        body.append({"type": "TextBlock", "text": "Top evidence", "weight": "Bolder"})
        body.extend({"type": "TextBlock", "text": f"- {e}", "wrap": True} for e in evidence)
    if verdict.get("recommendation"):
        body.append(
            {
                "type": "TextBlock",
                "text": f"Recommendation: {verdict['recommendation']}",
                "wrap": True,
            }
        )
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
    }
    if payload.get("url"):
        card["actions"] = [
            {"type": "Action.OpenUrl", "title": "Open the verdict", "url": str(payload["url"])}
        ]
    return card


def teams(url: str, payload: dict[str, Any]) -> HttpMessage:
    body = {
        "type": "message",
        "attachments": [
            {
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": None,
                "content": adaptive_card(payload),
            }
        ],
    }
    return HttpMessage(url, _json(body), {"Content-Type": "application/json"})


# --- PagerDuty Events API v2 ---------------------------------------------------------------------


def pagerduty_severity(payload: dict[str, Any]) -> str:
    verdict = _verdict(payload)
    if verdict.get("family") == "hardware_fault":
        return "critical"
    return "error" if verdict.get("category") == "infrastructure" else "warning"


def pagerduty_event(routing_key: str, payload: dict[str, Any]) -> dict[str, Any]:
    # dedup_key: the incident's public id, so trigger, change and resolve are one PagerDuty
    # alert (a test event gets its own key: it must not touch a real alert).
    dedup_key = str(payload.get("incident") or payload.get("event_id"))
    if payload.get("kind") == "resolved":
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key}
    verdict = _verdict(payload)
    subject = verdict.get("subject") or {}
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup_key,
        "payload": {
            "summary": truncate(
                f"{title(payload)} — {subject_line(payload)}", PAGERDUTY_SUMMARY_CHARS
            ),
            "source": str(
                subject.get("node") or subject.get("job") or subject.get("gpu") or "proof"
            ),
            "severity": pagerduty_severity(payload),
            "class": str(verdict.get("family") or ""),
            "group": str(verdict.get("category") or ""),
            "custom_details": {
                "category": verdict.get("category"),
                "family": verdict.get("family"),
                "subject": subject,
                "impact": impact_line(payload),
                "evidence": evidence_lines(payload),
                "recommendation": verdict.get("recommendation"),
                "confidence": verdict.get("confidence"),
            },
        },
    }
    if payload.get("url"):
        event["links"] = [{"href": str(payload["url"]), "text": "Open the verdict"}]
    return event


def pagerduty(events_url: str, routing_key: str, payload: dict[str, Any]) -> HttpMessage:
    return HttpMessage(
        events_url,
        _json(pagerduty_event(routing_key, payload)),
        {"Content-Type": "application/json"},
    )


# --- Generic webhooks, signed per Standard Webhooks ----------------------------------------------

SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's prefix, not a secret


def secret_bytes(secret: str) -> bytes:
    """The key a `whsec_<base64>` secret stands for (the spec signs with the decoded bytes)."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def webhook(
    url: str, payload: dict[str, Any], *, msg_id: str, timestamp: int, secrets: Iterable[str]
) -> HttpMessage:
    """The body is the verdict JSON; one signature per active secret, space-separated."""
    body = _json(_verdict(payload))
    signatures = " ".join(signature(s, msg_id, timestamp, body) for s in secrets)
    headers = {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
    }
    return HttpMessage(url, body, headers)


# --- E-mail --------------------------------------------------------------------------------------


def email_subject(payload: dict[str, Any]) -> str:
    # Header folding aside, a subject line over ~200 characters is cut by most clients.
    return truncate(f"[Proof] {title(payload)}", 200)


def email_text(payload: dict[str, Any]) -> str:
    verdict = _verdict(payload)
    lines = [
        title(payload),
        "",
        f"Category: {verdict.get('category') or '?'}",
        f"Family: {verdict.get('family') or '?'}",
        f"Subject: {subject_line(payload)}",
        f"Impact: {impact_line(payload)}",
        "",
        str(verdict.get("summary") or ""),
        "",
        "Top evidence:",
        *(f"  - {e}" for e in evidence_lines(payload)),
        "",
        f"Recommendation: {verdict.get('recommendation') or ''}",
    ]
    if payload.get("url"):
        lines += ["", f"Open the verdict: {payload['url']}"]
    return "\n".join(lines) + "\n"
