from __future__ import annotations

from django.urls import path

from webapp.counseling import views

urlpatterns = [
    path("", views.my_sessions, name="my_sessions"),
    path("start/", views.start, name="start_session"),
    path("<int:pk>/", views.chat, name="chat"),
    path("<int:pk>/transcript/", views.transcript, name="transcript"),
    path("<int:pk>/end/", views.end, name="end_session"),
]
