"""Client pages: my sessions, the chat page, ending a session with a rating."""

from __future__ import annotations

import contextlib
import logging

from channels.layers import get_channel_layer
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.accounts.models import Role
from webapp.counseling import services
from webapp.counseling.forms import RatingForm
from webapp.counseling.models import Session
from webapp.counseling.turns import end_session
from webapp.lib.access import consent_needed_redirect, lacks_counseling_consent, role_required
from webapp.lib.groups import session_group

security_log = logging.getLogger("psyevo.security")


def _own_session(request: HttpRequest, pk: int) -> Session:
    """The client's own session, or 404 (logged): never reveal that others exist."""
    session = Session.objects.select_related("course").filter(pk=pk, client=request.user).first()
    if session is None:
        security_log.warning("denied user=%s session=%s (not theirs)", request.user.username, pk)
        raise Http404("No such session")
    return session


@role_required(Role.CLIENT)
def my_sessions(request: HttpRequest) -> HttpResponse:
    sessions = (
        Session.objects.filter(client=request.user).select_related("course").order_by("-started_at")
    )
    return render(
        request,
        "counseling/my_sessions.html",
        {
            "sessions": sessions,
            "open_session": services.open_session_for(request.user),
            # Past transcripts stay readable after a withdrawal; only starting needs consent.
            "needs_consent": lacks_counseling_consent(request.user),
        },
    )


@role_required(Role.CLIENT)
@require_POST
def start(request: HttpRequest) -> HttpResponse:
    try:
        session = services.start_session(request.user)
    except services.SessionError as exc:
        if exc.code == "no_consent":
            return consent_needed_redirect()  # the reason is said on that page
        messages.error(request, exc.message)
        return redirect("my_sessions")
    return redirect("chat", pk=session.pk)


@role_required(Role.CLIENT)
def chat(request: HttpRequest, pk: int) -> HttpResponse:
    session = _own_session(request, pk)
    if session.status != Session.Status.OPEN:
        return redirect("transcript", pk=session.pk)
    turns = session.turns.order_by("seq")
    return render(
        request,
        "counseling/chat.html",
        {"session": session, "turns": turns, "rating_form": RatingForm()},
    )


@role_required(Role.CLIENT)
def transcript(request: HttpRequest, pk: int) -> HttpResponse:
    session = _own_session(request, pk)
    return render(
        request,
        "counseling/transcript.html",
        {"session": session, "turns": session.turns.order_by("seq")},
    )


@role_required(Role.CLIENT)
@require_http_methods(["POST"])
def end(request: HttpRequest, pk: int) -> HttpResponse:
    """End the session with or without a rating. Runs the session-end learning step
    (credit, posterior updates, memory recap) before answering."""
    from asgiref.sync import async_to_sync

    session = _own_session(request, pk)
    if session.status != Session.Status.OPEN:
        messages.info(request, "This session had already ended.")
        return redirect("my_sessions")
    form = RatingForm(request.POST)
    if not form.is_valid():
        turns = session.turns.order_by("seq")
        return render(
            request,
            "counseling/chat.html",
            {"session": session, "turns": turns, "rating_form": form},
            status=400,
        )
    try:
        async_to_sync(end_session)(session.pk, services.rating_from(form.rating()))
    except services.SessionError as exc:
        messages.info(request, exc.message)
        return redirect("my_sessions")
    with contextlib.suppress(Exception):  # other tabs learn on their next action
        async_to_sync(get_channel_layer().group_send)(
            session_group(session.pk),
            {
                "type": "chat.close",
                "html": '<div id="status" hx-swap-oob="innerHTML"><p class="status">This session has ended.</p></div>',
            },
        )
    messages.success(
        request, "Thank you. Your session is saved." if form.rating() else "Your session is saved."
    )
    return redirect("my_sessions")
