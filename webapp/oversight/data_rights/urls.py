"""The client's own data, mounted at /me/data/."""

from __future__ import annotations

from django.urls import path

from webapp.oversight.data_rights import views

urlpatterns = [
    path("", views.my_data, name="my_data"),
    path("download.json", views.my_data_download, name="my_data_download"),
]
