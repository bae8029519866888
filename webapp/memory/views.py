"""The client's "What I remember" page: read and correct what the counselor keeps."""

from __future__ import annotations

import logging

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from webapp.accounts.models import Role
from webapp.lib.access import role_required
from webapp.lib.forms import MemoryCorrectionForm
from webapp.memory import services
from webapp.memory.models import MemoryItem

security_log = logging.getLogger("psyevo.security")


@role_required(Role.CLIENT)
def my_memory(request: HttpRequest) -> HttpResponse:
    return render(request, "memory/my_memory.html", {"items": services.active_items(request.user)})


@role_required(Role.CLIENT)
@require_POST
def correct(request: HttpRequest, pk: int) -> HttpResponse:
    if not MemoryItem.objects.filter(pk=pk, client=request.user).exists():
        security_log.warning("denied user=%s memory=%s (not theirs)", request.user.username, pk)
        raise Http404("No such memory")
    form = MemoryCorrectionForm(request.POST)
    if not form.is_valid():  # NUL, lone surrogates, empty or too long: say why, store nothing
        errors = form.errors.as_data().get("text", [])
        if any(error.code == "required" for error in errors):
            messages.error(request, "The corrected text must not be empty.")
        else:
            messages.error(request, " ".join(m for error in errors for m in error.messages))
        return redirect("my_memory")
    try:
        services.correct(pk, form.cleaned_data["text"], by=request.user, client=request.user)
    except services.MemoryError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, "Thank you, the counselor will remember the corrected version.")
    return redirect("my_memory")
