"""ASGI entry point: HTTP through Django, websockets through Channels.

``get_asgi_application()`` runs first so the app registry is ready before any consumer
module (which imports models) is loaded.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from webapp.accounts.mfa import MfaScopeMiddleware  # noqa: E402
from webapp.counseling import spool  # noqa: E402
from webapp.counseling.consumers import warm_crisis_model  # noqa: E402
from webapp.lib.crypto import warn_if_development_key  # noqa: E402
from webapp.routing import websocket_urlpatterns  # noqa: E402

warn_if_development_key()
warm_crisis_model()  # only the servers: workers import the consumers module too
spool.replay_soon()  # crises a previous process held when it died
application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(MfaScopeMiddleware(URLRouter(websocket_urlpatterns)))
        ),
    }
)
