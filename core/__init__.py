"""Plumbing shared by the apps: input limits, API errors, pagination, OpenAPI, throttling, logging, commands.

Nothing here knows jobs: the apps (scheduler, audit, accounts, pages) import it, and ``config/``
only wires it into the project (settings, urls). It is not a Django app (no models, no templates).
"""
