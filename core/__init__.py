"""Plumbing shared by the apps: JSON input limits, DRF errors, pagination, OpenAPI, throttling, health, middleware.

Nothing here knows jobs: the apps (scheduler, audit, accounts, pages) import it, and ``config/``
only wires it into the project (settings, urls). It is not a Django app (no models, no templates).
"""
