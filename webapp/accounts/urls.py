from __future__ import annotations

from django.urls import path

from webapp.accounts import mfa_views, views

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", views.PsyEvoLoginView.as_view(), name="login"),
    path("logout/", views.logout_view, name="logout"),
    path("account/mfa/setup/", mfa_views.mfa_setup, name="mfa_setup"),
    path("account/mfa/verify/", mfa_views.mfa_verify, name="mfa_verify"),
    path("me/consent/", views.consent, name="consent"),
    path("clinician/", views.clinician_home, name="clinician_home"),
    path("console/", views.admin_home, name="admin_home"),
]
