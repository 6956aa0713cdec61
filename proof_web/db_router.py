"""All ORM traffic goes through the application role ("default").

The "owner" alias exists only so that `manage.py migrate` can run as the schema owner; no
request, task or service ever reads or writes through it.
"""

from __future__ import annotations

from typing import Any


class AppRoleRouter:
    def db_for_read(self, model: type, **hints: Any) -> str:
        return "default"

    def db_for_write(self, model: type, **hints: Any) -> str:
        return "default"

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return True
