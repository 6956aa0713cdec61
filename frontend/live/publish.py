"""Sending a live message from wherever the pipeline runs, without ever raising into it.

Production (Redis channel layer): `async_to_sync(layer.group_send)` from the committing thread
(a Celery worker, the ingest server), as Channels documents; the web processes' consumers read
it from Redis.

Embedded and tests (in-memory channel layer): the layer's queues are plain asyncio queues of
the web server's event loop, and putting into one from another thread's loop does not wake the
server's loop (asyncio is not thread-safe: the consumer would hear it only at the loop's next
unrelated wake-up). So the send is handed to the loop the consumers run on
(`asyncio.run_coroutine_threadsafe`), which each consumer records when it connects. With no
consumer connected in this process there is no loop and nothing to send: nobody could hear it.

Every failure is logged and swallowed: a verdict or a stored batch never fails because the
console could not be told.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import BaseChannelLayer, InMemoryChannelLayer, get_channel_layer

log = logging.getLogger(__name__)

# The group message type the consumer handles (LiveConsumer.live_message).
MESSAGE_TYPE = "live.message"

_loop_lock = threading.Lock()
_consumer_loop: asyncio.AbstractEventLoop | None = None


def note_consumer_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Called by each connecting consumer: in-memory sends go to this loop."""
    global _consumer_loop  # one loop per process, set by the consumers
    with _loop_lock:
        _consumer_loop = loop


def _live_loop() -> asyncio.AbstractEventLoop | None:
    with _loop_lock:
        loop = _consumer_loop
    if loop is None or loop.is_closed():
        return None
    return loop


def publish(groups: Iterable[str], payload: dict[str, Any]) -> None:
    """Send `payload` (the JSON a client receives) to every connection in `groups`."""
    try:
        layer = get_channel_layer()
        if layer is None:
            return
        event = {"type": MESSAGE_TYPE, "payload": payload}
        names = sorted(set(groups))
        if isinstance(layer, InMemoryChannelLayer):
            _send_on_consumer_loop(layer, names, event)
        else:
            async_to_sync(_send_all)(layer, names, event)
    except Exception:
        log.exception("live update %s not sent", payload.get("type"))


async def _send_all(layer: BaseChannelLayer, groups: list[str], event: dict[str, Any]) -> None:
    for group in groups:
        await layer.group_send(group, event)


def _send_on_consumer_loop(
    layer: InMemoryChannelLayer, groups: list[str], event: dict[str, Any]
) -> None:
    loop = _live_loop()
    if loop is None:
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:  # already on the consumers' loop (an async caller)
        loop.create_task(_send_all(layer, groups, event))
        return
    future = asyncio.run_coroutine_threadsafe(_send_all(layer, groups, event), loop)
    future.add_done_callback(_log_failure)


def _log_failure(future: Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("live update not sent: %s", future.exception())
