"""Admin console: posterior inspector (heatmaps, Fig. 6 diff, cell history), population
disagreement (Fig. 3), training runs and adapter lineage, the audit log, erasure.

Admins only. Reads of a client's posterior are audited. Adapter approval itself lives in
``webapp.learning`` (/adapters/); these pages link there.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, Max
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from counselor_engine.states import ALL_SLOTS
from webapp.accounts.models import Role, User
from webapp.learning.health import loop_health
from webapp.learning.models import AdapterVersion, TrainingRun
from webapp.lib import audit, plots
from webapp.lib.access import role_required
from webapp.oversight import audit_query, posteriors, training
from webapp.oversight.data_rights import erasure
from webapp.oversight.forms import AuditFilterForm, EraseForm, PopulationForm
from webapp.oversight.models import AuditEvent


def _client(client_id: int) -> User:
    return get_object_or_404(User, pk=client_id, role=Role.CLIENT)


@role_required(Role.ADMIN)
def clients(request: HttpRequest) -> HttpResponse:
    rows = (
        User.objects.filter(role=Role.CLIENT, is_active=True)
        .exclude(client_profile__simulated=True)  # the simulation lab's clients
        .select_related("client_profile__clinician")
        .annotate(
            session_count=Count("sessions", distinct=True), last_ended=Max("sessions__ended_at")
        )
        .order_by("username")
    )
    page = Paginator(rows, 100).get_page(request.GET.get("page"))
    return render(request, "oversight/admin_clients.html", {"page": page})


@role_required(Role.ADMIN)
def posterior_inspector(request: HttpRequest, client_id: int) -> HttpResponse:
    client = _client(client_id)
    view = posteriors.inspect(client, request.GET.get("before"), request.GET.get("after"))
    audit.record(
        request.user, "posterior.read", subject=client, target=f"client:{client.pk}",
        before=view.before.checkpoint.key, after=view.after.checkpoint.key,
    )  # fmt: skip
    return render(request, "oversight/posteriors.html", {"client": client, "view": view})


@role_required(Role.ADMIN)
def posterior_cell(request: HttpRequest, client_id: int) -> HttpResponse:
    client = _client(client_id)
    slot, skill = request.GET.get("slot", ""), request.GET.get("skill", "")
    modality = posteriors.modality_of(client)
    if slot not in ALL_SLOTS or skill not in posteriors.skill_ids(modality):
        raise Http404("No such cell")
    history = posteriors.cell_history(client, slot, skill)
    audit.record(request.user, "posterior.read", subject=client, target=f"cell:{slot}:{skill}")
    means = [posteriors.PRIOR_MEAN, *[u.mean_after for u in history]]
    sds = [posteriors.PRIOR_PRECISION**-0.5, *[u.precision_after**-0.5 for u in history]]
    labels = ["prior", *[f"#{i} s{u.session_id}" for i, u in enumerate(history, start=1)]]
    last = f"{history[-1].pk}@{history[-1].created_at.timestamp()}" if history else "0"
    svg = plots.cached_svg(
        ("cell", client.pk, slot, skill, last),
        lambda: plots.cell_history(means, sds, labels, f"{slot} · {skill}"),
    )
    plot = plots.as_plot(svg, f"Posterior mean ± sd of {skill} at {slot} after each update")
    context = {"client": client, "slot": slot, "skill": skill, "history": history, "plot": plot}
    return render(request, "oversight/posterior_cell.html", context)


@role_required(Role.ADMIN)
def population(request: HttpRequest) -> HttpResponse:
    form = PopulationForm(request.GET or None)
    modality = (form.cleaned_data.get("modality") if form.is_valid() else "") or "cbt"
    pop = posteriors.population(modality)
    audit.record(
        request.user, "posterior.read", target=f"population:{modality}",
        clients=[c.pk for c in pop.clients],
    )  # fmt: skip
    context = {
        "form": form,
        "pop": pop,
        "plot": posteriors.population_plot(pop),
        "modality": modality,
    }
    return render(request, "oversight/population.html", context)


@role_required(Role.ADMIN)
def runs(request: HttpRequest) -> HttpResponse:
    page = Paginator(
        TrainingRun.objects.select_related(
            "output_version", "parent_version", "started_by"
        ).order_by("-created_at"),
        50,
    ).get_page(request.GET.get("page"))
    return render(request, "oversight/runs.html", {"page": page, "health": loop_health()})


@role_required(Role.ADMIN)
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(
        TrainingRun.objects.select_related("output_version", "parent_version", "started_by"), pk=pk
    )
    context = {
        "run": run,
        "plot": training.loss_plot(run),
        "points": training.loss_rows(run),
        "shares": training.shares(run),
    }
    return render(request, "oversight/run_detail.html", context)


@role_required(Role.ADMIN)
def lineage(request: HttpRequest) -> HttpResponse:
    versions = AdapterVersion.objects.select_related("parent", "approved_by").order_by("created_at")
    return render(request, "oversight/lineage.html", {"tree": training.lineage(list(versions))})


@role_required(Role.ADMIN)
def audit_log(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET or None)
    data = form.cleaned_data if form.is_valid() else {}
    page = Paginator(audit_query.filtered(data), 100).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {"form": form, "page": page, "query": query.urlencode()}
    return render(request, "oversight/audit_log.html", context)


@role_required(Role.ADMIN)
def audit_csv(request: HttpRequest) -> StreamingHttpResponse:
    form = AuditFilterForm(request.GET or None)
    data = form.cleaned_data if form.is_valid() else {}
    audit.record(request.user, "audit.export", filters={k: str(v) for k, v in data.items() if v})
    events = audit_query.filtered(data).iterator(chunk_size=2000)
    response = StreamingHttpResponse(audit_query.csv_rows(events), content_type="text/csv")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="psyevo-audit-{stamp}.csv"'
    return response


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def erase(request: HttpRequest, client_id: int) -> HttpResponse:
    client = get_object_or_404(User, pk=client_id, role=Role.CLIENT, is_active=True)
    form = EraseForm(client.username, request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            report = erasure.erase_client(request.user, client)
        except erasure.ErasureError as exc:
            messages.error(request, str(exc))
            return redirect("console_clients")
        messages.success(request, "The client's data is erased.")
        return redirect("console_erasure", pk=report.event.pk)
    context = {
        "client": client,
        "form": form,
        "counts": erasure.preview(client),
        "used": erasure.used_by_approved_adapters(client),
    }
    return render(request, "oversight/erase.html", context, status=400 if form.errors else 200)


@role_required(Role.ADMIN)
def erasure_report(request: HttpRequest, pk: int) -> HttpResponse:
    event = get_object_or_404(
        AuditEvent.objects.select_related("actor"), pk=pk, action="client.erase"
    )
    return render(request, "oversight/erasure_report.html", {"event": event})
