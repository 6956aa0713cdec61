"""The roles a principal can hold, apart from the models so that both tenants/models.py and
tenants/access.py import them without importing each other."""

from __future__ import annotations

from django.db import models


class Role(models.TextChoices):
    OPERATOR_ADMIN = "operator_admin", "Operator admin"
    OPERATOR_SUPPORT = "operator_support", "Operator support"
    CUSTOMER_ADMIN = "customer_admin", "Customer admin"
    CUSTOMER_VIEWER = "customer_viewer", "Customer viewer"


OPERATOR_ROLES = frozenset({Role.OPERATOR_ADMIN, Role.OPERATOR_SUPPORT})
CUSTOMER_ROLES = frozenset({Role.CUSTOMER_ADMIN, Role.CUSTOMER_VIEWER})
