"""Account services: registration, the ensured ADMIN account (``ensure_admin``) and refresh-token revocation."""

from __future__ import annotations

from django.contrib.auth.password_validation import validate_password
from django.db import transaction
from django.utils import timezone

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

    Returns (user, created). An existing account keeps its password, which is then not checked;
    it is the account of that name in any letter case (usernames are unique regardless of case,
    ``user_username_ci_unique``), and may be a USER's: the caller checks ``is_admin``, since anyone
    can register a free name. Raises django.core.exceptions.ValidationError when the password of a
    new account fails Django's validators (``AUTH_PASSWORD_VALIDATORS``, with the account for the
    similarity rule), as ``user_register`` and the console's password forms do.
    """
    user = User.objects.filter(username__iexact=username).first()
    if user is not None:
        return user, False
    validate_password(password, user=User(username=username, email=""))
    return User.objects.create_superuser(username=username, email="", password=password), True


def user_refresh_tokens_revoke(*, user_id: int) -> int:
    """Blacklist every unexpired refresh token issued to user ``user_id``; return how many it blacklisted.

    Called on every password change (``accounts.passwords``), so that tokens obtained with the
    old password, or stolen with it, stop working at once: the refresh endpoint refuses a
    blacklisted token with 401. Access tokens cannot be revoked and expire on their own
    (``JWT_ACCESS_LIFETIME_SECONDS``, 5 minutes). Uses simplejwt's ``token_blacklist`` tables,
    which record every refresh token issued (login and rotation alike).
    """
    from rest_framework_simplejwt.token_blacklist.models import BlacklistedToken, OutstandingToken

    live = OutstandingToken.objects.filter(
        user_id=user_id, expires_at__gt=timezone.now(), blacklistedtoken__isnull=True
    )
    created = BlacklistedToken.objects.bulk_create(
        [BlacklistedToken(token_id=token_id) for token_id in live.values_list("id", flat=True)], ignore_conflicts=True
    )
    return len(created)
