"""Sending a live message from wherever the pipeline runs, without ever raising into it or
waiting on it.

A send is a coroutine (the channel layer's `group_send`) handed to an event loop with
`asyncio.run_coroutine_threadsafe`, fire and forget:
- in-memory channel layer (embedded, tests): the loop the consumers run on, which each consumer
  records when it connects. The layer's queues are plain asyncio queues of that loop, and
  putting into one from another thread's loop would not wake it (asyncio is not thread-safe:
  the consumer would hear it only at the loop's next unrelated wake-up). With no consumer
  connected in this process there is no loop and nothing to send: nobody could hear it.
- Redis channel layer (production): one publisher loop per process, in a daemon thread started
  on the first send. channels_redis keeps its connections per event loop, so one long-lived
  loop reuses them, where `async_to_sync` per send would open a connection each time.

At most MAX_IN_FLIGHT sends wait at once (a slow or unreachable Redis): past that a message is
dropped and logged. Every failure is logged and swallowed: a verdict or a stored batch never
fails or waits because the console could not be told.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from channels.layers import BaseChannelLayer, InMemoryChannelLayer, get_channel_layer

log = logging.getLogger(__name__)

# The group message type the consumer handles (LiveConsumer.live_message).
MESSAGE_TYPE = "live.message"
MAX_IN_FLIGHT = 1_000

_lock = threading.Lock()
_consumer_loop: asyncio.AbstractEventLoop | None = None
_publisher_loop: asyncio.AbstractEventLoop | None = None
_in_flight = 0


def note_consumer_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Called by each connecting consumer: in-memory sends go to this loop."""
    global _consumer_loop  # one loop per process, set by the consumers
    with _lock:
        _consumer_loop = loop


def _live_loop(layer: BaseChannelLayer) -> asyncio.AbstractEventLoop | None:
    global _publisher_loop  # started once per process, on the first send over Redis
    with _lock:
        if isinstance(layer, InMemoryChannelLayer):
            loop = _consumer_loop
            return None if loop is None or loop.is_closed() else loop
        if _publisher_loop is None:
            _publisher_loop = asyncio.new_event_loop()
            threading.Thread(
                target=_publisher_loop.run_forever, name="live-publisher", daemon=True
            ).start()
        return _publisher_loop


def publish(groups: Iterable[str], payload: dict[str, Any]) -> None:
    """Send `payload` (the JSON a client receives) to every connection in `groups`."""
    global _in_flight  # the sends not yet done, bounded by MAX_IN_FLIGHT
    kind = str(payload.get("type"))
    try:
        layer = get_channel_layer()
        if layer is None:
            return
        loop = _live_loop(layer)
        if loop is None:
            return
        with _lock:
            if _in_flight >= MAX_IN_FLIGHT:
                log.warning("live update %s dropped: %d sends still waiting", kind, _in_flight)
                return
            _in_flight += 1
        event = {"type": MESSAGE_TYPE, "payload": payload}
        future = asyncio.run_coroutine_threadsafe(
            _send_all(layer, sorted(set(groups)), event), loop
        )
        future.add_done_callback(lambda done: _finished(done, kind))
    except Exception:
        log.exception("live update %s not sent", kind)


async def _send_all(layer: BaseChannelLayer, groups: list[str], event: dict[str, Any]) -> None:
    for group in groups:
        await layer.group_send(group, event)


def _finished(future: Future[None], kind: str) -> None:
    global _in_flight  # see publish()
    with _lock:
        _in_flight -= 1
    if not future.cancelled() and future.exception() is not None:
        log.error("live update %s not sent: %s", kind, future.exception())
