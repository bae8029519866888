"""The client's own data, mounted at /me/data/."""

from __future__ import annotations

from django.urls import path

from webapp.oversight import client_views

urlpatterns = [
    path("", client_views.my_data, name="my_data"),
    path("download.json", client_views.my_data_download, name="my_data_download"),
]
