from django.apps import AppConfig


class OversightConfig(AppConfig):
    name = "webapp.oversight"
    label = "oversight"
