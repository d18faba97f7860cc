"""Account services: registration and token revocation."""

from __future__ import annotations

from django.contrib.auth.password_validation import validate_password
from django.db import transaction

from accounts.models import Role, User


@transaction.atomic
def user_register(*, username: str, password: str, email: str = "") -> User:
    """Create a USER account (never an ADMIN) with an Argon2-hashed password.

    Raises django.core.exceptions.ValidationError when the password fails Django's validators.
    """
    user = User(username=username, email=email, role=Role.USER, is_staff=False, is_superuser=False)
    validate_password(password, user=user)
    user.set_password(password)
    user.save()
    return user


def admin_ensure(*, username: str, password: str) -> tuple[User, bool]:
    """Create the ADMIN ``username`` with ``password`` unless it exists.

    Returns (user, created). An existing account keeps its password.
    """
    user = User.objects.filter(username=username).first()
    if user is not None:
        return user, False
    return User.objects.create_superuser(username=username, email="", password=password), True
