"""Bundled example models for precompile-serve (see models.py)."""
