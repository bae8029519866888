"""PsyEvo counselor engine: the paper's math, model backends and one counseling session.

Pure Python + numpy + torch. This package never imports Django (see docs/architecture.md):
it takes and returns plain dataclasses so it can be tested without a database and run
headless by the simulation lab.
"""
