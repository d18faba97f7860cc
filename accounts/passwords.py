"""What happens when a password changes: the user's refresh tokens stop working.

Django calls ``password_changed(password, user)`` on every validator in
``AUTH_PASSWORD_VALIDATORS`` after any save that follows ``set_password`` (the admin's two
password forms, ``manage.py changepassword``, any page or service), the documented hook for
"the password changed" (e.g. password history). ``RevokeRefreshTokensOnChange`` is such a
validator: it validates nothing and, on a change, blacklists the user's outstanding refresh
tokens (``accounts.services.user_refresh_tokens_revoke``). Sessions need no such step: Django
ends every other session of the user by itself when the password hash changes.
"""

from __future__ import annotations

from typing import Any


class RevokeRefreshTokensOnChange:
    """A password "validator" whose only job is to revoke refresh tokens when a password changes."""

    def validate(self, password: str, user: Any = None) -> None:
        """Accept every password: the other validators judge them."""

    def password_changed(self, password: str, user: Any = None) -> None:
        """Blacklist every outstanding refresh token of ``user`` (a saved User)."""
        from accounts.services import user_refresh_tokens_revoke

        if user is not None and user.pk is not None:
            user_refresh_tokens_revoke(user_id=user.pk)

    def get_help_text(self) -> str:
        """Nothing to tell the person choosing a password."""
        return ""
