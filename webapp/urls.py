from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from webapp import health

admin.site.site_header = "PsyEvo Counselor administration"
admin.site.site_title = "PsyEvo admin"

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("sessions/", include("webapp.counseling.urls")),
    path("memory/", include("webapp.memory.urls")),
    path("clinician/", include("webapp.oversight.urls")),
    path("adapters/", include("webapp.learning.urls")),
    path("console/", include("webapp.oversight.console_urls")),
    path("me/data/", include("webapp.oversight.data_rights.urls")),
    path("", include("webapp.accounts.urls")),
]
