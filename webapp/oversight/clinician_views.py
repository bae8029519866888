"""Clinician console: a client's page (courses, sessions, outcome trend), the session
review (why each reply was chosen), memory review and the per-client skill controls.

Every view is for clinicians only, and only for their assigned clients: anything else is
a 404, a security log line and an ``access.denied`` audit event. Reads of a transcript or
memory are audited. Model text is rendered autoescaped.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.accounts.models import ClientProfile, Role, User
from webapp.counseling.models import Course, Session
from webapp.lib import audit
from webapp.lib.access import role_required
from webapp.lib.forms import MemoryCorrectionForm
from webapp.memory import services as memory_services
from webapp.memory.models import MemoryItem
from webapp.oversight import console, evidence
from webapp.oversight.forms import SkillControlForm
from webapp.oversight.models import ClientControl, SafetyFlag


def _client_or_404(request: HttpRequest, client_id: int) -> ClientProfile:
    profile = console.assigned_profile(request.user, client_id)
    if profile is None:
        console.record_denial(request.user, request.path, client_id=client_id)
        raise Http404("No such client")
    return profile


def _item_client_or_404(request: HttpRequest, client_id: int, item_id: int) -> ClientProfile:
    """The assigned client whose memory item this is: an item id of another client under
    an assigned client's path is refused like any other client's page."""
    profile = _client_or_404(request, client_id)
    if not MemoryItem.objects.filter(pk=item_id, client=profile.user).exists():
        owner = MemoryItem.objects.filter(pk=item_id).values_list("client_id", flat=True).first()
        console.record_denial(request.user, request.path, client_id=owner, what=f"memory={item_id}")
        raise Http404("No such memory")
    return profile


@role_required(Role.CLINICIAN)
def client_detail(request: HttpRequest, client_id: int) -> HttpResponse:
    profile = _client_or_404(request, client_id)
    client = profile.user
    audit.record(request.user, "client.read", subject=client, target=f"client:{client.pk}")
    trend = console.outcome_trend(client)
    courses = (
        Course.objects.filter(client=client).prefetch_related("sessions").order_by("-created_at")
    )
    context = {
        "profile": profile,
        "client": client,
        "courses": courses,
        "trend": trend,
        "trend_plot": console.trend_plot(client, trend),
        "control": ClientControl.objects.filter(client=client).first(),
        "open_flags": SafetyFlag.objects.filter(client=client, acknowledged_at__isnull=True),
    }
    return render(request, "oversight/client_detail.html", context)


@role_required(Role.CLINICIAN)
def session_review(request: HttpRequest, pk: int) -> HttpResponse:
    session = console.reviewable_session(request.user, pk)
    if session is None:
        owner = Session.objects.filter(pk=pk).values_list("client_id", flat=True).first()
        console.record_denial(request.user, request.path, client_id=owner, what=f"session={pk}")
        raise Http404("No such session")
    assigned = console.assigned_profile(request.user, session.client_id) is not None
    flags = SafetyFlag.objects.filter(session=session).select_related(
        "client", "acknowledged_by", "escalated_to"
    )
    context: dict[str, object] = {
        "session": session,
        "assigned": assigned,
        "not_assigned": not assigned,  # here through an escalated flag only
        "flags": flags,
    }
    if not console.review_consented(session.client):
        # Review withdrawn: a safety flag still reaches the clinician, with the flagged
        # turn only (said on "My choices"); without one there is nothing to show.
        turns = console.flagged_turns(session)
        if not turns:
            return review_withdrawn(request, session)
        audit.record(
            request.user, "transcript.read_flagged", subject=session.client,
            target=f"session:{pk}", turns=[t.seq for t in turns],
        )  # fmt: skip
        context.update(review_withdrawn=True, items=[console.ReviewTurn(t) for t in turns])
        return render(request, "oversight/session_review.html", context)
    audit.record(request.user, "transcript.read", subject=session.client, target=f"session:{pk}")
    context.update(
        items=console.review(session),
        evidence=evidence.note(session, session.posterior_updates.count()),
    )
    return render(request, "oversight/session_review.html", context)


def review_withdrawn(
    request: HttpRequest, session: Session | None = None, *, client: User | None = None
) -> HttpResponse:
    """403: the client withdrew consent to clinician review (audited, and a security log
    line like every refusal). ``session`` for a transcript or live page, ``client`` for
    a page about the client as a whole (their memory)."""
    client = session.client if session is not None else client
    assert client is not None, "a session or a client"
    target = f"session:{session.pk}" if session is not None else f"client:{client.pk}"
    console.security_log.info(
        "refused user=%s %s (clinician review consent withdrawn)", request.user.username, target
    )
    audit.record(
        request.user, "access.denied", subject=client, target=target,
        reason="clinician review consent withdrawn",
    )  # fmt: skip
    return render(
        request,
        "oversight/review_withdrawn.html",
        {"session": session, "client": client},
        status=403,
    )


def _memory_refused(request: HttpRequest, profile: ClientProfile) -> HttpResponse | None:
    """A client's memories are their words (recaps of what they said): while they withdraw
    clinician review, the memory page and its correct/retire actions are refused like their
    transcripts. A safety flag never rests on a memory, so nothing is carved out here."""
    if console.review_consented(profile.user):
        return None
    return review_withdrawn(request, client=profile.user)


@role_required(Role.CLINICIAN)
def memory(request: HttpRequest, client_id: int) -> HttpResponse:
    profile = _client_or_404(request, client_id)
    if refused := _memory_refused(request, profile):
        return refused
    audit.record(request.user, "memory.read", subject=profile.user, target=f"client:{client_id}")
    return render(
        request,
        "oversight/memory.html",
        {
            "profile": profile,
            "chains": console.memory_chains(profile.user),
            "form": MemoryCorrectionForm(),
        },
    )


@role_required(Role.CLINICIAN)
@require_POST
def memory_correct(request: HttpRequest, client_id: int, item_id: int) -> HttpResponse:
    profile = _item_client_or_404(request, client_id, item_id)
    if refused := _memory_refused(request, profile):
        return refused
    form = MemoryCorrectionForm(request.POST)
    try:
        if not form.is_valid():
            raise memory_services.MemoryError(" ".join(str(e) for e in form.errors.get("text", [])))
        memory_services.correct(
            item_id, form.cleaned_data["text"], by=request.user, client=profile.user
        )
        messages.success(request, "Memory corrected; the old version is kept in its history.")
    except memory_services.MemoryError as exc:
        messages.error(request, str(exc))
    return redirect("clinician_memory", client_id=client_id)


@role_required(Role.CLINICIAN)
@require_POST
def memory_retire(request: HttpRequest, client_id: int, item_id: int) -> HttpResponse:
    profile = _item_client_or_404(request, client_id, item_id)
    if refused := _memory_refused(request, profile):
        return refused
    try:
        memory_services.retire(item_id, by=request.user, client=profile.user)
        messages.success(request, "Memory retired: the counselor no longer uses it.")
    except memory_services.MemoryError as exc:
        messages.error(request, str(exc))
    return redirect("clinician_memory", client_id=client_id)


@role_required(Role.CLINICIAN)
@require_http_methods(["GET", "POST"])
def skill_controls(request: HttpRequest, client_id: int) -> HttpResponse:
    profile = _client_or_404(request, client_id)
    control = ClientControl.objects.filter(client=profile.user).first()
    initial = (
        {"pinned": control.pinned_skill, "excluded": control.excluded_skills} if control else {}
    )
    form = SkillControlForm(profile.modality, request.POST or None, initial=initial)
    saved = False
    if request.method == "POST" and form.is_valid():
        control = console.set_skill_controls(
            request.user, profile.user, profile.modality,
            form.cleaned_data["pinned"], form.cleaned_data["excluded"],
        )  # fmt: skip
        saved = True
        if not request.htmx:
            messages.success(request, "Skill controls saved: they apply from the next reply on.")
            return redirect("clinician_skills", client_id=client_id)
    template = "oversight/_skill_form.html" if request.htmx else "oversight/skills.html"
    context = {"profile": profile, "form": form, "control": control, "saved": saved}
    return render(request, template, context, status=400 if form.errors else 200)
