from __future__ import annotations

from django.urls import path

from webapp.oversight import views

urlpatterns = [
    path("sessions/<int:pk>/", views.live_session, name="live_session"),
    path("clients/<int:client_id>/pause/", views.pause, name="pause_ai"),
    path("clients/<int:client_id>/resume/", views.resume, name="resume_ai"),
    path("flags/<int:pk>/acknowledge/", views.acknowledge, name="acknowledge_flag"),
]
