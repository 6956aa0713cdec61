"""Websocket routes (live updates); apps add theirs here."""

from __future__ import annotations

from typing import Any

from frontend.live import routing as frontend_live

websocket_urlpatterns: list[Any] = [*frontend_live.websocket_urlpatterns]
