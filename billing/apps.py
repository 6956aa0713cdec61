from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        # Imported here, not at the top: receivers import models, which Django allows only
        # once the app registry is ready (the documented place to connect signal receivers).
        from billing import receivers  # noqa: F401
