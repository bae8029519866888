"""The clinician approval gate: pending adapter versions, their validation reports and
side-by-side replies, and the Approve / Reject / Roll back actions.

Clinicians and admins may look; only clinicians decide (see ``services.approve``);
clients never reach these pages. Views parse, authorise and delegate to ``services``.
Replies shown here are model output: untrusted text, rendered autoescaped. Side-by-side
client states are shown only when no client wrote them (``reports``).
"""

from __future__ import annotations

from typing import cast

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from webapp.accounts.models import Role, User
from webapp.learning import reports, services
from webapp.learning.models import AdapterVersion, SimulationRun, TrainingRun
from webapp.lib.access import deny, role_required

Status = AdapterVersion.Status
LINEAGE_DEPTH = 20


class ApproveForm(forms.Form):
    note = forms.CharField(
        required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2})
    )


class RejectForm(forms.Form):
    reason = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))


class RollbackForm(forms.Form):
    reason = forms.CharField(required=False, max_length=2000)


@role_required(Role.CLINICIAN, Role.ADMIN)
def adapter_list(request: HttpRequest) -> HttpResponse:
    versions = AdapterVersion.objects.select_related("parent", "approved_by").order_by(
        "-created_at"
    )
    return render(
        request,
        "learning/adapter_list.html",
        {
            "pending": versions.filter(status=Status.PENDING_APPROVAL),
            "superseded": versions.filter(status=Status.SUPERSEDED)[:20],
            "versions": versions[:200],
            "runs": TrainingRun.objects.select_related("output_version", "started_by").order_by(
                "-created_at"
            )[:20],
        },
    )


def _lineage(version: AdapterVersion) -> list[AdapterVersion]:
    chain: list[AdapterVersion] = []
    current = version.parent
    while current is not None and len(chain) < LINEAGE_DEPTH:
        chain.append(current)
        current = current.parent
    return chain


def _user(request: HttpRequest) -> User:
    """The logged-in user (``role_required`` already sent anonymous users away)."""
    return cast(User, request.user)


def _may_approve(request: HttpRequest, run: TrainingRun | None) -> bool:
    user = _user(request)
    return user.role == Role.CLINICIAN and (run is None or run.started_by_id != user.pk)


@role_required(Role.CLINICIAN, Role.ADMIN)
def adapter_detail(request: HttpRequest, pk: int) -> HttpResponse:
    version = get_object_or_404(
        AdapterVersion.objects.select_related("parent", "approved_by"), pk=pk
    )
    run = TrainingRun.objects.filter(output_version=version).select_related("started_by").first()
    report = version.validation_report or {}
    return render(
        request,
        "learning/adapter_detail.html",
        {
            "version": version,
            "run": run,
            "lineage": _lineage(version),
            "checks": report.get("checks", []),
            "side_by_side": reports.showable_side_by_side(report),
            "active": services.active_version(),
            "pending": version.status == Status.PENDING_APPROVAL,
            "may_approve": _may_approve(request, run),
            "may_roll_back": version.status in (Status.APPROVED, Status.RETIRED),
            "approve_form": ApproveForm(),
            "reject_form": RejectForm(),
            "rollback_form": RollbackForm(),
        },
    )


def _decide(
    request: HttpRequest, pk: int, form_class: type[forms.Form], action: str
) -> HttpResponse:
    version = get_object_or_404(AdapterVersion, pk=pk)
    form = form_class(request.POST)
    if not form.is_valid():
        messages.error(request, "Please give a reason.")
        return redirect("learning:adapter", pk=pk)
    try:
        if action == "approve":
            services.approve(version, _user(request), form.cleaned_data["note"])
            messages.success(request, f"{version.name} is approved and active for new sessions.")
        elif action == "reject":
            services.reject(version, _user(request), form.cleaned_data["reason"])
            messages.success(request, f"{version.name} is rejected; its evidence is returned.")
        else:
            services.rollback(version, _user(request), form.cleaned_data["reason"])
            messages.success(request, f"{version.name} is active again for new sessions.")
    except services.GateError as exc:
        messages.error(request, str(exc))
    return redirect("learning:adapter", pk=pk)


@role_required(Role.CLINICIAN)
@require_POST
def approve(request: HttpRequest, pk: int) -> HttpResponse:
    version = get_object_or_404(AdapterVersion, pk=pk)
    run = TrainingRun.objects.filter(output_version=version).first()
    if not _may_approve(request, run):
        # Whoever started a round cannot approve its output (``services.approve`` refuses
        # too); refused here as an authorization failure: 403 and a security log line.
        raise deny(request, f"started the round that produced adapter {pk}")
    return _decide(request, pk, ApproveForm, "approve")


@role_required(Role.CLINICIAN)
@require_POST
def reject(request: HttpRequest, pk: int) -> HttpResponse:
    return _decide(request, pk, RejectForm, "reject")


@role_required(Role.CLINICIAN, Role.ADMIN)
@require_POST
def rollback(request: HttpRequest, pk: int) -> HttpResponse:
    return _decide(request, pk, RollbackForm, "rollback")


# -- simulation lab reports (clinicians and admins) ------------------------------------


@role_required(Role.CLINICIAN, Role.ADMIN)
def simulation_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(
        SimulationRun.objects.select_related("adapter").order_by("-created_at"), 50
    ).get_page(request.GET.get("page"))
    return render(request, "learning/simulation_list.html", {"page": page})


@role_required(Role.CLINICIAN, Role.ADMIN)
def simulation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    from webapp.learning import simreport  # matplotlib and the lab load on first use

    run = get_object_or_404(SimulationRun.objects.select_related("adapter"), pk=pk)
    summary = run.report or {}
    allocation = summary.get("allocation", {})
    distribution = allocation.get("distribution") or []
    states = [
        {
            "key": key,
            "sessions": allocation.get("sessions", {}).get(key, 0),
            "p": distribution[i] if i < len(distribution) else None,
        }
        for i, key in enumerate(allocation.get("states", []))
    ]
    families = summary.get("families", [])
    return render(
        request,
        "learning/simulation_detail.html",
        {
            "run": run,
            "summary": summary,
            "families": families,
            "sessions": [
                {**row, "values": [row["metrics"].get(f) for f in families]}
                for row in summary.get("sessions", [])
            ],
            "by_session": [
                {**row, "values": [row.get(f) for f in families]}
                for row in summary.get("by_session", [])
            ],
            "pass_rates": list(summary.get("pass_rates", {}).items()),
            "guard": [
                {"version": version, **counts, "rules": list(counts.get("by_rule", {}).items())}
                for version, counts in summary.get("guard", {}).items()
            ],
            "states": states,
            "plots": simreport.page_plots(run),
        },
    )
