from __future__ import annotations

import pytest
from django.db import connection

from tenants.context import system_context, tenant_context
from tenants.models import Customer, Operator


@pytest.mark.django_db
def test_tenant_context_hides_other_operators_rows() -> None:
    with system_context():
        a = Operator.objects.create(name="A", slug="a")
        b = Operator.objects.create(name="B", slug="b")
        Customer.objects.create(operator=a, name="ca", slug="ca")
        Customer.objects.create(operator=b, name="cb", slug="cb")
    with tenant_context(a.pk):
        names = sorted(Customer.objects.values_list("name", flat=True))
    if connection.vendor == "postgresql":
        assert names == ["ca"]
    else:
        assert names == ["ca", "cb"]
    assert list(Customer.objects.for_tenant(a).values_list("name", flat=True)) == (
        ["ca"] if connection.vendor != "postgresql" else []
    )
