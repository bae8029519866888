from webapp.learning.tests.helpers import lipo_settings, tiny_model_dir

__all__ = ["lipo_settings", "tiny_model_dir"]
