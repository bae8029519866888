"""Helpers every web app shares (as healthchecks keeps ``hc/lib/``); a plain package, not an app."""
