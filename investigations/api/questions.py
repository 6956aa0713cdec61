""" "Ask about this incident" over the API (docs/investigations.md):

- `POST /api/v1/incidents/<public_id>/questions/` {"question"} → 202 with the question's `id`
  (state `pending`); the `investigations.answer_question` task answers it (10–30 s with the
  default model on 2 cores);
- `GET /api/v1/incidents/<public_id>/questions/<id>/` → {question, state, answer, cited,
  validated, refused, reason, duration_s, …}; `GET …/questions/` lists the incident's, newest
  first.

Whoever may see the incident may read its questions; asking needs a principal that may write
(operator roles, a customer's admin on its own jobs' incidents). Another tenant's incident,
another customer's, a fleet-health incident for a customer: 404, before the body is read.
Asking is rate-limited per user (or token) at PROOF_ASK_RATE, apart from the API's own rate:
each question costs a model run.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

from investigations import ask_services
from investigations.incident_actions import ActionInputError
from investigations.models import Incident, IncidentQuestion, QuestionState
from investigator.ask import MAX_QUESTION_CHARS
from tenants.api.base import TenantScopedViewSet
from tenants.api.permissions import principal_or_none


class QuestionSerializer(serializers.ModelSerializer[IncidentQuestion]):
    id = serializers.UUIDField(source="public_id", read_only=True)
    incident = serializers.UUIDField(source="incident.public_id", read_only=True)
    state = serializers.ChoiceField(
        choices=QuestionState.choices,
        read_only=True,
        help_text="pending (the model is at it), answered, or refused (reason says why)",
    )
    answer = serializers.CharField(
        read_only=True,
        help_text="validated model text citing [e…]/[t…] ids, or the refusal; empty while pending",
    )
    cited = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="the evidence (e…) and check finding (t…) ids the answer cites",
    )
    reason = serializers.CharField(
        read_only=True, help_text="why it was refused: out of scope, a validator's complaint, …"
    )
    duration_s = serializers.FloatField(read_only=True, allow_null=True)

    class Meta:
        model = IncidentQuestion
        fields = [
            "id",
            "incident",
            "revision",
            "question",
            "state",
            "answer",
            "cited",
            "validated",
            "refused",
            "reason",
            "duration_s",
            "asked_by",
            "created_at",
            "answered_at",
        ]
        read_only_fields = fields


class AskSerializer(serializers.Serializer[dict[str, Any]]):
    question = serializers.CharField(
        max_length=MAX_QUESTION_CHARS, help_text="a question about this incident"
    )


class QuestionRateThrottle(SimpleRateThrottle):
    """Questions per user (or API token) at PROOF_ASK_RATE: each one is a model run."""

    scope = "question"

    def get_rate(self) -> str:
        return str(settings.PROOF_ASK_RATE)

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        principal = principal_or_none(request)
        if principal is None:
            return None
        who = (
            f"token:{principal.api_token_id}"
            if principal.api_token_id is not None
            else f"user:{principal.user_id}"
        )
        # The user's joining time too: a user recreated with the same id (a test database, a
        # restored backup) is not counted with the old one.
        joined = getattr(request.user, "date_joined", None)
        stamp = f"{joined.timestamp():.6f}" if joined is not None else ""
        ident = f"{principal.operator_id}:{who}:{stamp}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


_ID = "5d0f6a7e-2c1b-4c3d-9e8f-7a6b5c4d3e2f"
_QUESTION_EXAMPLE = {
    "id": _ID,
    "incident": "3f2c1d9e-8a47-4b1e-9c55-0d6e2a7b4f10",
    "revision": 2,
    "question": "Which rank is slow, and since when?",
    "state": "answered",
    "answer": "Rank 3 on gpu-07 was the slowest rank in 100% of blocks since 09:14:05 UTC [e2].",
    "cited": ["e2"],
    "validated": True,
    "refused": False,
    "reason": "",
    "duration_s": 14.2,
    "asked_by": "ana",
    "created_at": "2026-12-02T09:50:12Z",
    "answered_at": "2026-12-02T09:50:26Z",
}
_REFUSED_EXAMPLE = {
    **_QUESTION_EXAMPLE,
    "question": "Will it rain tomorrow?",
    "answer": "The evidence does not say anything about 'rain' or 'tomorrow': it holds this "
    "incident's verdict and the job, node, fabric and storage checks only.",
    "cited": [],
    "validated": False,
    "refused": True,
    "reason": "out of scope",
    "duration_s": 0.01,
}
_INCIDENT_ID = OpenApiParameter(
    "incident_public_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="the incident"
)
_QUESTION_ID = OpenApiParameter(
    "public_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="the question's id"
)


@extend_schema_view(
    list=extend_schema(
        summary="Questions asked about an incident, newest first",
        parameters=[_INCIDENT_ID],
        examples=[OpenApiExample("Answered", _QUESTION_EXAMPLE, response_only=True)],
    ),
    retrieve=extend_schema(
        summary="One question: pending, answered (validated, cited) or refused (why)",
        parameters=[_INCIDENT_ID, _QUESTION_ID],
        examples=[
            OpenApiExample("Answered", _QUESTION_EXAMPLE, response_only=True),
            OpenApiExample("Refused", _REFUSED_EXAMPLE, response_only=True),
        ],
    ),
    create=extend_schema(
        summary="Ask about this incident (answered by a task: poll the question)",
        parameters=[_INCIDENT_ID],
        request=AskSerializer,
        responses={202: OpenApiResponse(QuestionSerializer, description="pending")},
        examples=[
            OpenApiExample(
                "A question", {"question": "Which rank is slow, and since when?"}, request_only=True
            ),
        ],
    ),
)
class QuestionViewSet(TenantScopedViewSet):
    model = IncidentQuestion
    route = r"incidents/(?P<incident_public_id>[^/.]+)/questions"
    serializer_class = QuestionSerializer
    lookup_field = "public_id"
    lookup_value_regex = "[^/.]+"
    http_method_names = ["get", "post", "head", "options"]

    def _incident_key(self) -> uuid.UUID:
        """The incident's public id, once the principal may see it (404 otherwise)."""
        try:
            key = uuid.UUID(str(self.kwargs.get("incident_public_id")))
        except ValueError:
            raise Http404("No such incident.") from None
        if not Incident.objects.for_tenant(self.principal).filter(public_id=key).exists():
            raise Http404("No such incident.")
        return key

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        key = self._incident_key()
        if self.action == "retrieve":
            try:
                uuid.UUID(str(self.kwargs.get(self.lookup_field)))
            except ValueError:
                raise Http404("No such question.") from None
        return queryset.filter(incident__public_id=key).select_related("incident")

    def get_throttles(self) -> list[BaseThrottle]:
        throttles = list(super().get_throttles())
        if self.action == "create":
            throttles.append(QuestionRateThrottle())
        return throttles

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, ActionInputError):
            exc = ValidationError({exc.field: [exc.problem]})
        return super().handle_exception(exc)

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = self._incident_key()  # a foreign incident is 404 before the body is read
        fields = self.validated(AskSerializer)
        row = ask_services.do_ask(self.principal, key, fields["question"])
        row = self.get_queryset().get(pk=row.pk)
        return Response(self.get_serializer(row).data, status=status.HTTP_202_ACCEPTED)
