"""Login, logout, the role-based home pages and the client's consent page."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.views import LoginView
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from webapp.accounts.forms import ConsentForm, LoginForm
from webapp.accounts.models import ClientProfile, ConsentPurpose, ConsentRecord, Role, User
from webapp.counseling.models import Session
from webapp.learning.models import AdapterVersion, TrainingRun
from webapp.learning.schedule import withdraw_evidence
from webapp.lib.access import (
    NEEDS_COUNSELING_CONSENT,
    consent_needed_redirect,
    lacks_counseling_consent,
    role_required,
    same_site_path,
)
from webapp.oversight import alerts
from webapp.oversight.models import ClientControl, SafetyFlag

ROLE_HOME = {Role.CLIENT: "my_sessions", Role.CLINICIAN: "clinician_home", Role.ADMIN: "admin_home"}


class PsyEvoLoginView(LoginView):
    form_class = LoginForm
    redirect_authenticated_user = True

    def get_redirect_url(self) -> str:
        """``next``, when it is a path on this site that does not lead back here.

        For a logged-in user Django's LoginView raises ValueError ("Redirection loop") on
        ``?next=/login/``, a 500 that any link could trigger, and ``?next=/login/?x`` would
        bounce the browser between this page and itself: both go to the home page instead.
        """
        url = same_site_path(super().get_redirect_url())  # a path on this site, or home
        if url and unquote(urlsplit(url).path).rstrip("/") == reverse("login").rstrip("/"):
            return ""
        return url


@require_POST
def logout_view(request: HttpRequest) -> HttpResponse:
    logout(request)
    messages.info(request, "You are logged out.")
    return redirect("login")


def home(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return redirect("login")
    if request.user.role == Role.CLIENT and lacks_counseling_consent(request.user):
        return consent_needed_redirect()
    return redirect(ROLE_HOME[Role(request.user.role)])


def _profile(user: User) -> ClientProfile | None:
    return ClientProfile.objects.filter(user=user).select_related("clinician").first()


@role_required(Role.CLIENT)
@require_http_methods(["GET", "POST"])
def consent(request: HttpRequest) -> HttpResponse:
    profile = _profile(request.user)
    if profile is None:
        messages.error(request, "Your account has no client profile yet; ask your clinic.")
        return redirect("my_sessions")
    state = profile.consent_state()
    why = request.GET.get("why") if request.GET.get("why") == NEEDS_COUNSELING_CONSENT else None
    if request.method == "POST":
        form = ConsentForm(request.POST)
        if form.is_valid():
            with transaction.atomic():
                for purpose in ConsentPurpose:
                    wanted = form.cleaned_data[purpose.value]
                    current = state[purpose.value]
                    if current is None or current.granted != wanted:
                        ConsentRecord.objects.create(
                            profile=profile,
                            purpose=purpose,
                            granted=wanted,
                            recorded_by=request.user,
                        )
                        if purpose == ConsentPurpose.TRAINING and not wanted:
                            withdraw_evidence(profile.user)  # out of the buffer at once
            messages.success(request, "Your choices are saved.")
            if why and form.cleaned_data[ConsentPurpose.COUNSELING.value]:
                return redirect("my_sessions")  # they came here to start talking
            return redirect(request.get_full_path())
    else:
        form = ConsentForm(
            initial={purpose: bool(record and record.granted) for purpose, record in state.items()}
        )
    return render(
        request, "accounts/consent.html", {"form": form, "state": state, "needs_counseling": why}
    )


@role_required(Role.CLINICIAN)
def clinician_home(request: HttpRequest) -> HttpResponse:
    profiles = (
        ClientProfile.objects.filter(clinician=request.user)
        .select_related("user")
        .order_by("user__username")
    )
    ids = [p.user_id for p in profiles]
    open_sessions = {
        s.client_id: s
        for s in Session.objects.filter(client_id__in=ids, status=Session.Status.OPEN)
    }
    paused = set(
        ClientControl.objects.filter(client_id__in=ids, ai_paused=True).values_list(
            "client_id", flat=True
        )
    )
    rows = [
        {"profile": p, "open_session": open_sessions.get(p.user_id), "paused": p.user_id in paused}
        for p in profiles
    ]
    flags = (
        SafetyFlag.objects.filter(client_id__in=ids, acknowledged_at__isnull=True)
        .select_related("client")
        .order_by("-created_at")[:50]
    )
    return render(
        request,
        "accounts/clinician_home.html",
        {
            "clients": rows,
            "flags": flags,
            "failed_alerts": alerts.failed_deliveries(clinician=request.user),
            "no_email": not request.user.email.strip(),
        },
    )


@role_required(Role.ADMIN)
def admin_home(request: HttpRequest) -> HttpResponse:
    counts = {role.label: User.objects.filter(role=role, is_active=True).count() for role in Role}
    context = {
        "counts": counts,
        "pending": AdapterVersion.objects.filter(
            status=AdapterVersion.Status.PENDING_APPROVAL
        ).count(),
        "running": TrainingRun.objects.filter(
            status__in=[TrainingRun.Status.QUEUED, TrainingRun.Status.RUNNING]
        ).count(),
        "failed_alerts": alerts.failed_deliveries(),
        "no_email": alerts.clinicians_without_email(),
    }
    return render(request, "oversight/console_home.html", context)
