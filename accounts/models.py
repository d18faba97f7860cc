"""The custom user model with a USER/ADMIN role."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractUser, UserManager
from django.db import models
from django.db.models.functions import Lower


class Role(models.TextChoices):
    """What a user may do: USER sees own jobs; ADMIN sees and operates all."""

    USER = "USER", "User"
    ADMIN = "ADMIN", "Admin"


class StintUserManager(UserManager["User"]):
    """Manager whose superusers are ADMINs (``manage.py createsuperuser``)."""

    def create_superuser(self, username: str, email: str | None = None, password: str | None = None, **extra: Any):
        """Create a staff superuser with role ADMIN."""
        extra.setdefault("role", Role.ADMIN)
        return super().create_superuser(username, email, password, **extra)


class User(AbstractUser):
    """A Stint user; ``role`` decides API visibility, ``is_staff`` admin-site access."""

    role = models.CharField(max_length=8, choices=Role.choices, default=Role.USER)

    objects = StintUserManager()

    class Meta(AbstractUser.Meta):
        constraints = [
            # "Alice" and "alice" are one name to people: the database refuses the second, even
            # when two registrations race past the case-insensitive check in the serializer.
            models.UniqueConstraint(
                Lower("username"),
                name="user_username_ci_unique",
                violation_error_message="A user with that username already exists.",
            ),
        ]

    @property
    def is_admin(self) -> bool:
        """True for the ADMIN role."""
        return self.role == Role.ADMIN
