from django.apps import AppConfig


class OversightConfig(AppConfig):
    name = "webapp.oversight"
    label = "oversight"

    def ready(self) -> None:
        # Role and assignment changes are audited wherever they are made.
        from webapp.oversight import signals  # noqa: F401
