from __future__ import annotations

from django.urls import path

from webapp.oversight import clinician_views, views

urlpatterns = [
    path("sessions/<int:pk>/", views.live_session, name="live_session"),
    path("clients/<int:client_id>/pause/", views.pause, name="pause_ai"),
    path("clients/<int:client_id>/resume/", views.resume, name="resume_ai"),
    path("flags/<int:pk>/acknowledge/", views.acknowledge, name="acknowledge_flag"),
    # The clinician console (assigned clients only).
    path("clients/<int:client_id>/", clinician_views.client_detail, name="clinician_client"),
    path("clients/<int:client_id>/memory/", clinician_views.memory, name="clinician_memory"),
    path(
        "clients/<int:client_id>/memory/<int:item_id>/correct/",
        clinician_views.memory_correct,
        name="clinician_memory_correct",
    ),
    path(
        "clients/<int:client_id>/memory/<int:item_id>/retire/",
        clinician_views.memory_retire,
        name="clinician_memory_retire",
    ),
    path(
        "clients/<int:client_id>/skills/", clinician_views.skill_controls, name="clinician_skills"
    ),
    path("sessions/<int:pk>/review/", clinician_views.session_review, name="session_review"),
]
