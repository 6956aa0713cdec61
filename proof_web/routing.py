"""Websocket routes (live updates); apps add theirs here."""

from __future__ import annotations

from typing import Any

websocket_urlpatterns: list[Any] = []
