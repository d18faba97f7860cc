"""Create the ADMIN account for `make run`, printing a generated password once."""

from __future__ import annotations

import argparse
import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from accounts.services import admin_ensure


def username(text: str) -> str:
    """argparse type: a name the user model accepts (its field's validators and length), else a usage error."""
    try:
        return get_user_model()._meta.get_field("username").clean(text, None)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(" ".join(exc.messages)) from exc


class Command(BaseCommand):
    """Ensure the ADMIN ``admin`` exists; its password is STINT_ADMIN_PASSWORD or generated."""

    help = "Create the ADMIN account (default name 'admin') if missing."

    def add_arguments(self, parser: Any) -> None:
        """Accept --username."""
        parser.add_argument("--username", type=username, default="admin")

    def handle(self, *args: Any, **options: Any) -> None:
        """Create the account once; print the password only when it was generated now.

        Raises CommandError, one line, when STINT_ADMIN_PASSWORD holds bytes that are not UTF-8,
        the password validators refuse it (``admin_ensure``), or the name (in any letter case)
        belongs to an account that is not an ADMIN: anyone may register a free name through the
        public API, so it is neither reported as the ADMIN nor promoted.
        """
        given = os.environ.get("STINT_ADMIN_PASSWORD", "")
        try:
            given.encode("utf-8")
        except UnicodeEncodeError:  # a byte that is not UTF-8 reaches os.environ as a lone surrogate
            raise CommandError("STINT_ADMIN_PASSWORD is not UTF-8 text; set it in UTF-8 and run again") from None
        password = given or secrets.token_urlsafe(18)
        try:
            user, created = admin_ensure(username=options["username"], password=password)
        except ValidationError as exc:
            which = "STINT_ADMIN_PASSWORD" if given else "the generated password"
            raise CommandError(f"{which} is refused by the password validators: {' '.join(exc.messages)}") from None
        if not created and not user.is_admin:
            raise CommandError(
                f"the account '{user.username}' exists but is not an ADMIN (role {user.role}); nothing was changed."
                " Give it the Admin role and Staff status in the console if it is yours, or choose another --username"
            )
        if not created:
            self.stdout.write(f"ADMIN account '{user.username}' already exists.")
        elif given:
            self.stdout.write(f"Created ADMIN '{options['username']}' with STINT_ADMIN_PASSWORD.")
        else:
            self.stdout.write(self.style.SUCCESS(f"Created ADMIN '{options['username']}' with password: {password}"))
            self.stdout.write("This password is printed only once.")
