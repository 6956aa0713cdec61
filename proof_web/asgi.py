"""ASGI entry point: HTTP through Django, websockets through Channels (live updates)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proof_web.settings")
django_asgi_app = get_asgi_application()

# E402 below: these import models (Channels' auth, our consumers), so they must come after
# get_asgi_application() has set Django up; Channels documents this order.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from proof_web import heap  # noqa: E402
from proof_web.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
heap.settle()  # after the application and its routes are loaded: proof_web/heap.py
