from __future__ import annotations

from django.urls import path

from webapp.accounts import views

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", views.PsyEvoLoginView.as_view(), name="login"),
    path("logout/", views.logout_view, name="logout"),
    path("me/consent/", views.consent, name="consent"),
    path("clinician/", views.clinician_home, name="clinician_home"),
    path("console/", views.admin_home, name="admin_home"),
]
