"""Verdicts rendered for a ticket: ?format=markdown and ?format=text of verdicts the live
pipeline wrote from simulated runs — every part of the verdict is there, each evidence entry is
one row of the table with its signal, GPU, rank, node, interval and value; the JSON stays the
contract object; an unknown format is a 400 naming it; other tenants and customers get 404 in
every format; the list's query count does not grow with rows."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from investigations.api.renderers import evidence_cells, interval_text
from investigations.models import Incident
from investigations.tests.test_api_incident_actions import (
    World,
    _fresh_caches,  # noqa: F401 - the autouse fixture, applied here too
    bearer,
    evaluate,
    session,
    world_fixture,  # noqa: F401 - the fixture `world`
)

pytestmark = pytest.mark.django_db


def _get(client: APIClient, incident: Incident, fmt: str | None) -> Any:
    suffix = f"?format={fmt}" if fmt else ""
    return client.get(f"/api/v1/verdicts/{incident.public_id}/{suffix}")


def test_markdown_has_every_part_and_one_table_row_per_evidence_entry(world: World) -> None:
    verdict = world.mine.verdict
    assert verdict["evidence"], "the pipeline's verdict cites evidence"
    response = _get(session(world.a.operator_support), world.mine, "markdown")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    text = response.content.decode()
    assert text.startswith(f"### {verdict['title']}\n")
    assert f"**{verdict['category'].upper()}**" in text
    for part in ("summary", "recommendation"):
        assert f"**{part.capitalize()}:** {verdict[part]}" in text
    assert "**Impact:** " in text and "**Confidence:** " in text
    assert f"{round(verdict['confidence'] * 100)}%" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table[0] == "| Signal | GPU | Rank | Node | Interval (UTC) | Value |"
    rows = table[1:]
    assert len(rows) == len(verdict["evidence"])
    for line, entry in zip(rows, verdict["evidence"], strict=True):
        cells = [c.strip() for c in line.strip("| ").split(" | ")]
        assert cells[0].startswith(entry["signal"])
        assert cells[1] == (entry["gpu"] or "")
        assert cells[2] == ("" if entry["rank"] is None else str(entry["rank"]))
        assert cells[3] == (entry["node"] or "")
        assert cells[4] == interval_text(entry["interval"])
        assert cells[5] == evidence_cells(entry)[5]
        assert cells[5]  # every row states its value
    assert "**Checked and cleared**" in text
    for check in verdict["cleared"]:
        assert f"- {check['check']}: {check['result']}" in text
    page = f"{settings.PROOF_PUBLIC_URL.rstrip('/')}/incidents/{world.mine.public_id}/"
    assert f"Verdict page: {page}" in text


def test_text_rendering_aligns_the_evidence_table(world: World) -> None:
    verdict = world.theirs.verdict
    response = _get(session(world.a.operator_admin), world.theirs, "text")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    text = response.content.decode()
    lines = text.splitlines()
    assert lines[0] == verdict["title"]
    assert lines[2].startswith(verdict["category"].upper())
    assert f"Summary: {verdict['summary']}" in text
    assert f"Recommendation: {verdict['recommendation']}" in text
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("Signal"))
    rows = lines[header + 1 : header + 1 + len(verdict["evidence"])]
    # Columns line up: the Node column starts at the same offset on every row.
    node_at = lines[header].index("Node")
    for line, entry in zip(rows, verdict["evidence"], strict=True):
        assert entry["signal"] in line
        if entry["node"]:
            assert line[node_at:].startswith(entry["node"])
        assert evidence_cells(entry)[5] in line
        if entry["gpu"]:
            assert entry["gpu"] in line
    assert "Checked and cleared:" in text
    assert f"/incidents/{world.theirs.public_id}/" in text


def test_json_is_the_contract_object_and_unknown_formats_are_400(world: World) -> None:
    api = session(world.a.operator_admin)
    for fmt in (None, "json"):
        response = _get(api, world.mine, fmt)
        assert response.status_code == 200 and response.json() == world.mine.verdict
    unknown = _get(api, world.mine, "xml")
    assert unknown.status_code == 400
    problems = unknown.json()["error"]["fields"]["format"]
    assert "'xml'" in problems[0] and "markdown" in problems[0] and "text" in problems[0]
    # Asked with an Accept header instead of ?format=.
    by_accept = api.get(f"/api/v1/verdicts/{world.mine.public_id}/", HTTP_ACCEPT="text/markdown")
    assert by_accept["Content-Type"].startswith("text/markdown")


def test_other_tenants_and_customers_get_404_in_every_format(world: World) -> None:
    outsiders = [
        bearer(world.b.api_token(world.b.operator_admin)),
        session(world.second_admin),
    ]
    for client in outsiders:
        for fmt in (None, "markdown", "text"):
            response = _get(client, world.mine, fmt)
            assert response.status_code == 404, (fmt, response.content)
            assert world.mine.verdict["title"] not in response.content.decode()
    # Errors keep the API's one JSON shape, whatever format was asked for.
    refused = _get(outsiders[0], world.mine, "markdown")
    assert refused["Content-Type"] == "application/json"
    assert refused.json()["error"] == {"status": 404, "code": "not_found", "message": "Not found."}
    # The customer's own: yes.
    own = _get(session(world.a.customer_viewer), world.mine, "markdown")
    assert own.status_code == 200 and world.mine.verdict["title"] in own.content.decode()


def _titles(text: str) -> int:
    return sum(line.startswith("### ") for line in text.splitlines())


def test_verdict_list_in_markdown_and_its_query_count(world: World) -> None:
    api = session(world.a.operator_admin)
    with CaptureQueriesContext(connection) as few:
        listed = api.get("/api/v1/verdicts/?format=markdown")
    assert listed.status_code == 200
    text = listed.content.decode()
    assert f"### {world.mine.verdict['title']}" in text
    assert f"### {world.theirs.verdict['title']}" in text
    assert str(world.other.public_id) not in text
    evaluate(world.a, "checkpoint_stall", world.a.customer, seed=5)
    with CaptureQueriesContext(connection) as many:
        more = api.get("/api/v1/verdicts/?format=markdown")
    assert _titles(more.content.decode()) == _titles(text) + 1
    assert len(many.captured_queries) == len(few.captured_queries)
    # A page of one says where the next is.
    paged = api.get("/api/v1/verdicts/?format=text&page_size=1").content.decode()
    assert "Next page: http://testserver/api/v1/verdicts/?" in paged and "cursor=" in paged
