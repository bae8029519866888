from webapp.learning.tests.helpers import lipo_settings

__all__ = ["lipo_settings"]
