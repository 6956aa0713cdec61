"""`/ws/live/`: the console's live updates (docs/console.md "Live updates").

Authenticated by the session cookie (Channels' AuthMiddlewareStack in proof_web/asgi.py); the
principal is resolved as for a page (tenants.selectors.principal_for_user, the logic of
tenants/middleware.py). A connection without a signed-in user is accepted and closed at once
with code 4401 (a close code is the one answer a browser's WebSocket can read; refusing the
handshake reads as a network error), a signed-in user without a membership with 4403.

The server alone decides what a connection hears (groups.default_groups). A client may then
narrow to one job or one incident:
    {"subscribe": {"job": "<job id>"}}   or   {"subscribe": {"incident": "<public id>"}}
which the server checks against what the principal may see (the same for_tenant() scoping as
the pages); one it may not see, or that does not exist, is refused with
    {"type": "error", "error": "...", "job": "<job id>"}
and the connection keeps hearing what it heard before, nothing of that job.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from frontend.live import groups
from frontend.live.publish import note_consumer_loop
from ingest.models import Job
from investigations.models import Incident
from tenants.access import Principal
from tenants.context import tenant_context
from tenants.selectors import principal_for_user

CLOSE_NOT_SIGNED_IN = 4401
CLOSE_NO_MEMBERSHIP = 4403
MAX_JOB_ID = 512


def _visible_job(principal: Principal, job_id: str) -> bool:
    with tenant_context(principal.operator_id):
        return Job.objects.for_tenant(principal).filter(job_id=job_id).exists()


def _visible_incident(principal: Principal, public_id: uuid.UUID) -> int | None:
    with tenant_context(principal.operator_id):
        return (
            Incident.objects.for_tenant(principal)
            .filter(public_id=public_id)
            .values_list("pk", flat=True)
            .first()
        )


class LiveConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    principal: Principal | None = None
    joined: frozenset[str] = frozenset()

    async def connect(self) -> None:
        user = self.scope.get("user")
        signed_in = user is not None and user.is_authenticated
        principal = await database_sync_to_async(principal_for_user)(user) if signed_in else None
        await self.accept()
        if not signed_in:
            await self.close(code=CLOSE_NOT_SIGNED_IN)
            return
        if principal is None:
            await self.close(code=CLOSE_NO_MEMBERSHIP)
            return
        self.principal = principal
        note_consumer_loop(asyncio.get_running_loop())
        await self._listen_to(groups.default_groups(principal))
        await self.send_json(
            {"type": "hello", "hears": "customer" if principal.is_customer else "fleet"}
        )

    async def disconnect(self, code: int) -> None:
        await self._listen_to(set())

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        principal = self.principal
        if principal is None:
            return
        subscribe = content.get("subscribe") if isinstance(content, dict) else None
        if not isinstance(subscribe, dict) or len(subscribe) != 1:
            await self._error(
                'expected {"subscribe": {"job": "<job id>"}} or '
                '{"subscribe": {"incident": "<public id>"}}'
            )
            return
        ((what, value),) = subscribe.items()
        if what == "job":
            await self._narrow_to_job(principal, value)
        elif what == "incident":
            await self._narrow_to_incident(principal, value)
        else:
            await self._error(f"subscribe: unknown key {str(what)[:40]!r} (job or incident)")

    async def _narrow_to_job(self, principal: Principal, job_id: Any) -> None:
        if not isinstance(job_id, str) or not job_id or len(job_id) > MAX_JOB_ID:
            await self._error(f"subscribe.job: a job id of 1-{MAX_JOB_ID} characters expected")
            return
        if not await database_sync_to_async(_visible_job)(principal, job_id):
            await self._error(f"no job {job_id!r} you may see", job=job_id)
            return
        await self._listen_to({groups.job_group(principal.operator_id, job_id)})
        await self.send_json({"type": "subscribed", "job": job_id})

    async def _narrow_to_incident(self, principal: Principal, public_id: Any) -> None:
        try:
            parsed = uuid.UUID(str(public_id))
        except ValueError:
            await self._error(
                f"subscribe.incident: {str(public_id)[:60]!r} is not an incident id (a UUID)",
                incident=str(public_id)[:60],
            )
            return
        pk = await database_sync_to_async(_visible_incident)(principal, parsed)
        if pk is None:
            await self._error(f"no incident {parsed} you may see", incident=str(parsed))
            return
        await self._listen_to({groups.incident_group(pk)})
        await self.send_json({"type": "subscribed", "incident": str(parsed)})

    async def _listen_to(self, wanted: set[str]) -> None:
        layer = self.channel_layer
        for group in self.joined - wanted:
            await layer.group_discard(group, self.channel_name)
        for group in wanted - self.joined:
            await layer.group_add(group, self.channel_name)
        self.joined = frozenset(wanted)

    async def _error(self, message: str, **names: str) -> None:
        await self.send_json({"type": "error", "error": message, **names})

    async def live_message(self, event: dict[str, Any]) -> None:
        """A group message from frontend.live.publish: its payload is what the client gets."""
        await self.send_json(event["payload"])
