"""Stint's job scheduler app."""
