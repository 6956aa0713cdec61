from django.apps import AppConfig


class FrontendConfig(AppConfig):
    name = "frontend"

    def ready(self) -> None:
        # Connects the live updates' receivers (ingest's and investigations' signals).
        from frontend.live import receivers  # noqa: F401
