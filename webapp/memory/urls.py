from __future__ import annotations

from django.urls import path

from webapp.memory import views

urlpatterns = [
    path("", views.my_memory, name="my_memory"),
    path("<int:pk>/correct/", views.correct, name="correct_memory"),
]
