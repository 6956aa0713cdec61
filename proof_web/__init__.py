"""Proof's Django project: settings, URLs, ASGI, Celery and the `proof` command."""
