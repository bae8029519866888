from django.apps import AppConfig


class CounselingConfig(AppConfig):
    name = "webapp.counseling"
    label = "counseling"
