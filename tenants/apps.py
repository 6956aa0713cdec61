from django.apps import AppConfig
from django.db.models.signals import post_migrate

from tenants.rls import on_post_migrate  # imports no model: safe while the registry loads


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenancy"

    def ready(self) -> None:
        # Runs after every app's migrations (sender=None ties it to no single app), so tables
        # of apps migrated after tenants are covered too.
        post_migrate.connect(on_post_migrate, dispatch_uid="tenants.apply_rls")
