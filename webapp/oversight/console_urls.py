"""The admin console, mounted at /console/ (the console's home page is accounts.admin_home)."""

from __future__ import annotations

from django.urls import path

from webapp.oversight import admin_views as v

urlpatterns = [
    path("clients/", v.clients, name="console_clients"),
    path("clients/<int:client_id>/posteriors/", v.posterior_inspector, name="console_posteriors"),
    path(
        "clients/<int:client_id>/posteriors/cell/", v.posterior_cell, name="console_posterior_cell"
    ),
    path("clients/<int:client_id>/erase/", v.erase, name="console_erase"),
    path("erasures/<int:pk>/", v.erasure_report, name="console_erasure"),
    path("population/", v.population, name="console_population"),
    path("runs/", v.runs, name="console_runs"),
    path("runs/<int:pk>/", v.run_detail, name="console_run"),
    path("lineage/", v.lineage, name="console_lineage"),
    path("audit/", v.audit_log, name="console_audit"),
    path("audit.csv", v.audit_csv, name="console_audit_csv"),
]
