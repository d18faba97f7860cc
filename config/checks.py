"""Deploy checks (``manage.py check --deploy``): no secret may still hold a placeholder shipped in the example files.

``docker/.env.example`` and ``.env.example`` ship placeholders ("change-me-...", "<password>")
that satisfy every length rule, so a copy deployed without editing used to pass
``check --deploy``; and the dev stack's fixed keys (``config.settings``) are public. IDs:
``stint.E001``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

# Every placeholder contains it: docker/.env.example's, and what a person writing one would write.
PLACEHOLDER_MARK = "change-me"
# The other placeholders of .env.example (its commented lines, uncommented as they are).
PLACEHOLDER_VALUES = frozenset(
    {
        "<random, at least 32 bytes>",
        "<another random value, at least 32 bytes>",
        "<password>",
    }
)
GENERATE_HINT = 'Generate one with: python -c "import secrets; print(secrets.token_urlsafe(48))"'
DATABASE_PASSWORD = "DATABASE_URL's password"  # noqa: S105 - a name, not a password
DATABASE_HINT = "Set PostgreSQL's password (POSTGRES_PASSWORD in docker/.env) and the same one in DATABASE_URL."


def is_placeholder(value: Any) -> bool:
    """Return whether ``value`` (a setting's value) is, or contains, a placeholder of the example files."""
    if not isinstance(value, str) or not value:
        return False
    return PLACEHOLDER_MARK in value.lower() or value.strip() in PLACEHOLDER_VALUES


def secrets_in_use() -> list[tuple[str, Any]]:
    """Return (what, value) for each secret Stint reads: its variable name, and its value in the settings."""
    database = settings.DATABASES.get("default", {})
    # libpq also takes the password from the URL's query (?password=...): django-environ leaves it in OPTIONS.
    db_password = database.get("PASSWORD") or (database.get("OPTIONS") or {}).get("password", "")
    return [
        ("SECRET_KEY", settings.SECRET_KEY),
        ("JWT_SIGNING_KEY", settings.JWT_SIGNING_KEY),
        ("STINT_ADMIN_PASSWORD", getattr(settings, "STINT_ADMIN_PASSWORD", "")),
        ("METRICS_BEARER_TOKEN", getattr(settings, "METRICS_BEARER_TOKEN", "")),
        (DATABASE_PASSWORD, db_password),
    ]


def placeholder_errors(secrets: list[tuple[str, Any]]) -> list[checks.CheckMessage]:
    """Return one ``stint.E001`` Error per (what, value) of ``secrets`` holding a placeholder; never echo the value."""
    return [
        checks.Error(
            f"{what} is still a placeholder of docker/.env.example or .env.example: replace it with a secret of"
            " your own before deploying.",
            hint=DATABASE_HINT if what == DATABASE_PASSWORD else GENERATE_HINT,
            id="stint.E001",
        )
        for what, value in secrets
        if is_placeholder(value)
    ]


@checks.register(checks.Tags.security, deploy=True)
def placeholder_secrets(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Return one ``stint.E001`` Error per secret Stint reads that still holds an example file's placeholder.

    Source of the rule: the example files tell you to replace every "change-me"; nothing refused
    one that was left. The dev stack's fixed keys contain the mark too, so a production
    deployment cannot run on them either.
    """
    return placeholder_errors(secrets_in_use())
