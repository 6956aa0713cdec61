"""The API base: get_queryset cannot be overridden, scope_queryset narrows within the tenant."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import QuerySet
from rest_framework.test import APIRequestFactory, force_authenticate

from tenants.api.base import TenantScopedReadOnlyViewSet, TenantScopedViewSet
from tenants.api.serializers import CustomerSerializer
from tenants.models import Customer
from tenants.services import do_create_customer
from tenants.testing import make_tenant


def test_subclass_overriding_get_queryset_is_refused_at_definition() -> None:
    with pytest.raises(TypeError, match="overrides get_queryset; override scope_queryset"):

        class Leaky(TenantScopedViewSet):
            model = Customer

            def get_queryset(self) -> QuerySet[Any]:
                return Customer.objects.all()

    with pytest.raises(TypeError, match="overrides get_queryset"):

        class LeakyToo(TenantScopedReadOnlyViewSet):
            model = Customer

            def get_queryset(self) -> QuerySet[Any]:
                return Customer.objects.all()


class OnlySlugsStartingWithZ(TenantScopedReadOnlyViewSet):
    model = Customer
    serializer_class = CustomerSerializer

    def scope_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(slug__startswith="z")


@pytest.mark.django_db
def test_scope_queryset_narrows_inside_the_tenant_filter() -> None:
    a, b = make_tenant("basea"), make_tenant("baseb")
    mine = do_create_customer(a.operator.pk, name="Zed", slug="zed")
    do_create_customer(b.operator.pk, name="Zulu", slug="zulu")
    request = APIRequestFactory().get("/x/")
    request.principal = a.principal(a.operator_admin)  # type: ignore[attr-defined]
    force_authenticate(request, user=a.operator_admin)
    response = OnlySlugsStartingWithZ.as_view({"get": "list"})(request)
    assert response.status_code == 200
    assert [row["id"] for row in response.data["results"]] == [mine.pk]
