from __future__ import annotations

from django.urls import path

from webapp.learning import views

app_name = "learning"

urlpatterns = [
    path("", views.adapter_list, name="adapters"),
    path("<int:pk>/", views.adapter_detail, name="adapter"),
    path("<int:pk>/approve/", views.approve, name="approve"),
    path("<int:pk>/reject/", views.reject, name="reject"),
    path("<int:pk>/rollback/", views.rollback, name="rollback"),
    path("simulations/", views.simulation_list, name="simulations"),
    path("simulations/<int:pk>/", views.simulation_detail, name="simulation"),
]
