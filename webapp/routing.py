"""Websocket routes of every app, gathered in one list for the ASGI router."""

from __future__ import annotations

from django.urls import path

from webapp.accounts.consumers import NotificationConsumer
from webapp.counseling.consumers import SessionConsumer

websocket_urlpatterns = [
    path("ws/notifications/", NotificationConsumer.as_asgi()),
    path("ws/sessions/<int:session_id>/", SessionConsumer.as_asgi()),
]
