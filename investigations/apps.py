from django.apps import AppConfig


class InvestigationsConfig(AppConfig):
    name = "investigations"

    def ready(self) -> None:
        # Imported here, not at the top: receivers import models, which Django allows only
        # once the app registry is ready (the documented place to connect signal receivers).
        # The tasks connect the services' evaluation_due announcement to enqueuing
        # evaluate_job: imported in every process, not only where Celery discovers tasks.
        from investigations import (
            receivers,  # noqa: F401
            tasks,  # noqa: F401
        )
