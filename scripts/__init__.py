"""Operator scripts; ``scripts.cluster`` is importable by tests and benchmarks."""
