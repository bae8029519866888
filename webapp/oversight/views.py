"""Clinician pages for live oversight: alerts, joining a session, pausing the AI."""

from __future__ import annotations

import logging

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from webapp.accounts.models import Role
from webapp.counseling.models import Session
from webapp.lib import audit
from webapp.lib.access import pausable_profile, role_required, same_site_path
from webapp.oversight import console, services
from webapp.oversight.clinician_views import review_withdrawn
from webapp.oversight.models import ClientControl

security_log = logging.getLogger("psyevo.security")


def _overseen_session(request: HttpRequest, pk: int) -> Session:
    session = console.reviewable_session(request.user, pk)
    if session is None:
        security_log.warning("denied user=%s session=%s (not assigned)", request.user.username, pk)
        raise Http404("No such session")
    return session


@role_required(Role.CLINICIAN)
def live_session(request: HttpRequest, pk: int) -> HttpResponse:
    session = _overseen_session(request, pk)
    if not console.review_consented(session.client):
        return review_withdrawn(request, session)
    audit.record(request.user, "transcript.read", subject=session.client, target=f"session:{pk}")
    control = ClientControl.objects.filter(client=session.client).first()
    return render(
        request,
        "oversight/live_session.html",
        {"session": session, "turns": session.turns.order_by("seq"), "control": control},
    )


@role_required(Role.CLINICIAN)
@require_POST
def pause(request: HttpRequest, client_id: int) -> HttpResponse:
    return _set_pause(request, client_id, True)


@role_required(Role.CLINICIAN)
@require_POST
def resume(request: HttpRequest, client_id: int) -> HttpResponse:
    return _set_pause(request, client_id, False)


def _set_pause(request: HttpRequest, client_id: int, paused: bool) -> HttpResponse:
    profile = pausable_profile(request.user, client_id)
    if profile is None:
        security_log.warning(
            "denied user=%s client=%s (not assigned)", request.user.username, client_id
        )
        raise Http404("No such client")
    services.set_ai_paused(request.user, profile.user, paused)
    messages.success(
        request,
        f"The AI is paused for {profile.user.username}: you reply yourself."
        if paused
        else f"The AI counselor is back for {profile.user.username}.",
    )
    return redirect(same_site_path(request.POST.get("next")) or "clinician_home")


@role_required(Role.CLINICIAN)
@require_POST
def acknowledge(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        flag = services.acknowledge(request.user, pk)
    except services.OversightError as exc:
        security_log.warning("denied user=%s flag=%s (not assigned)", request.user.username, pk)
        raise Http404(str(exc)) from None
    if request.htmx:
        escalated = flag.escalated_to_id == request.user.pk
        return render(request, "oversight/_flag.html", {"flag": flag, "escalated": escalated})
    return redirect("clinician_home")
