"""Stripe's webhook endpoint: thin — verify the signature, process the event once, answer.

Not a tenant-scoped API view: Stripe is not a principal of any tenant; the event's customer
names the operator (billing/webhooks.py), and the signature is the only credential. A bad
signature is a 400 in the API's error shape, naming what was wrong; Stripe retries anything
but a 2xx, so a processed or already-processed event is a 200.
"""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from billing import tasks, webhooks
from tenants.api.errors import error_body


@csrf_exempt  # Stripe signs the request; there is no session or form to protect
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    try:
        event = webhooks.verify(request.body, request.headers.get("Stripe-Signature", ""))
        processed = webhooks.process(event)
    except webhooks.WebhookRefused as exc:
        return JsonResponse(error_body(400, str(exc), "invalid_webhook"), status=400)
    if processed.resume_operator is not None:
        operator_id = processed.resume_operator
        # The paused period's evaluation may take minutes: a task, not this request.
        transaction.on_commit(lambda: tasks.resume_verdicts.delay(operator_id))
    return JsonResponse(
        {"id": processed.event_id, "outcome": processed.outcome, "duplicate": processed.duplicate}
    )
