"""The console's websocket routes; proof_web/routing.py serves them under its ASGI stack
(session auth, origin check)."""

from __future__ import annotations

from typing import Any

from django.urls import path

from frontend.live.consumers import LiveConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/live/", LiveConsumer.as_asgi()),
]
