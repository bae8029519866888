"""The client's own data: a page explaining the download, and the JSON download."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from webapp.accounts.models import Role
from webapp.lib import audit
from webapp.lib.access import role_required
from webapp.oversight.data_rights import exports


@role_required(Role.CLIENT)
def my_data(request: HttpRequest) -> HttpResponse:
    return render(request, "oversight/my_data.html")


@role_required(Role.CLIENT)
def my_data_download(request: HttpRequest) -> HttpResponse:
    document = exports.client_export(request.user)
    audit.record(
        request.user, "data.export", subject=request.user, target=f"user:{request.user.pk}"
    )
    response = HttpResponse(
        json.dumps(document, indent=1, ensure_ascii=False), content_type="application/json"
    )
    stamp = timezone.now().strftime("%Y%m%d")
    response["Content-Disposition"] = f'attachment; filename="psyevo-my-data-{stamp}.json"'
    return response
