"""Per-user notification socket: crisis alerts and live updates reach open pages here.

Authorization happens in ``connect``, again before every event is forwarded, and on a
timer, so a socket closes within ``WS_REAUTH_SECONDS`` of logout or account disable even
when no event arrives (an idle alert page must not outlive its log-in).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError
from django.template.loader import render_to_string
from django.utils.html import escape

from webapp.accounts.models import User
from webapp.accounts.socket_auth import login_still_valid
from webapp.lib.groups import user_group
from webapp.oversight.models import SafetyFlag

log = logging.getLogger(__name__)
security_log = logging.getLogger("psyevo.security")


class NotificationConsumer(AsyncJsonWebsocketConsumer):
    groups: list[str] = []

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            security_log.warning("denied socket user=anonymous path=%s", self.scope.get("path"))
            await self.close(code=4401)
            return
        self.user_id = user.pk
        self.django_session_key = getattr(self.scope.get("session"), "session_key", None)
        self.group = user_group(user.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        self.reauth_task = asyncio.create_task(self._reauth_loop())

    async def _reauth_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.WS_REAUTH_SECONDS)
            try:
                allowed = await self._still_allowed()
            except DatabaseError as exc:  # PostgreSQL away: keep checking, never stop
                log.warning("notifications: re-check unavailable: %s", exc)
                continue
            if not allowed:
                await self.close(code=4401)
                return

    async def disconnect(self, code: int) -> None:
        task = getattr(self, "reauth_task", None)
        if task is not None:
            task.cancel()
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        await self.send_json(
            {"type": "error", "code": "read_only", "detail": "this socket only sends"}
        )

    async def notify(self, event: dict[str, Any]) -> None:
        """Group message ``{"type": "notify", "payload": {...}}`` from any server process,
        forwarded as an HTML fragment the page swaps in by id (htmx ws extension)."""
        if not await self._still_allowed():
            await self.close(code=4403)
            return
        await self.send(text_data=await self._render(event.get("payload", {})))

    @database_sync_to_async
    def _render(self, payload: dict[str, Any]) -> str:
        if payload.get("kind") == "safety_flag":
            flag = (
                SafetyFlag.objects.select_related("client", "acknowledged_by")
                .filter(pk=payload.get("flag"), client__client_profile__clinician_id=self.user_id)
                .first()
            )
            if flag is not None:
                body = render_to_string("oversight/_flag.html", {"flag": flag})
                return (
                    f'<div id="alerts" hx-swap-oob="afterbegin" data-kind="safety_flag" '
                    f'data-flag="{flag.pk}" data-level="{escape(flag.level)}">{body}</div>'
                    '<p id="no-alerts" hx-swap-oob="delete"></p>'
                )
        text = escape(str(payload.get("text", "")))
        kind = escape(str(payload.get("kind", "notice")))
        return f'<div id="notices" hx-swap-oob="beforeend"><p data-kind="{kind}">{text}</p></div>'

    @database_sync_to_async
    def _still_allowed(self) -> bool:
        """Still active and still logged in (``socket_auth.login_still_valid``)."""
        user = User.objects.filter(pk=self.user_id, is_active=True).first()
        return user is not None and login_still_valid(self.django_session_key, user)
