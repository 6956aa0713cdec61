from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "notify"

    def ready(self) -> None:
        # Receivers import models, which Django allows only once the registry is ready; the
        # tasks are imported in every process so the receivers can enqueue them.
        from notify import (
            receivers,  # noqa: F401
            tasks,  # noqa: F401
        )
