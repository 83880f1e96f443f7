"""Grades submitted notebooks against the reference package ``tfm_solution``."""
