"""Serializers for the auth endpoints."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.password_validation import validate_password
from rest_framework import serializers
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.settings import api_settings
from rest_framework_simplejwt import serializers as jwt_serializers

from accounts.models import User
from core.parsers import is_json_number, json_type_name


def _is_text_field(field: serializers.Field) -> bool:
    """True for a field whose JSON value is a string: a ``CharField``, or a ``ChoiceField`` of named choices."""
    if isinstance(field, serializers.CharField):
        return True
    if isinstance(field, serializers.ChoiceField) and not isinstance(field, serializers.MultipleChoiceField):
        return bool(field.choices) and all(isinstance(key, str) for key in field.choices)
    return False


def _choices_hint(field: serializers.Field) -> str:
    """``": one of HIGH, MEDIUM, LOW"`` for a field of named choices (what to send instead), else ""."""
    if isinstance(field, serializers.ChoiceField):
        return ": one of " + ", ".join(str(key) for key in field.choices)
    return ""


def _type_error(field: serializers.Field, value: Any) -> str | None:
    """Return why ``value`` (parsed JSON, not null) is the wrong JSON type for ``field``, or None.

    A text field (``_is_text_field``) takes a string; an ``IntegerField`` or a ``FloatField`` or
    ``DecimalField`` a number; a ``BooleanField`` true or false. An integer field given a number
    with a fraction is left to DRF, which takes ``5.0`` as 5 (as JSON Schema's "integer" does) and
    refuses ``5.5``; a float field takes ``1``. Other fields (JSON, datetimes, nested) are not
    judged here.
    """
    if _is_text_field(field):
        hint = _choices_hint(field)
        return None if isinstance(value, str) else f"A string is expected, not {json_type_name(value)}{hint}."
    if isinstance(field, serializers.IntegerField):
        return None if is_json_number(value) else f"An integer is expected, not {json_type_name(value)}."
    if isinstance(field, serializers.FloatField | serializers.DecimalField):
        return None if is_json_number(value) else f"A number is expected, not {json_type_name(value)}."
    if isinstance(field, serializers.BooleanField):
        return None if isinstance(value, bool) else f"true or false is expected, not {json_type_name(value)}."
    return None


class StrictTextMixin:
    """Refuse a body that is no JSON object, and a text, number or boolean field given another JSON type.

    DRF's CharField turns the numbers 5 and 7.5 into "5" and "7.5", so a ``"timezone": 5`` used
    to read back as "Unknown time zone '5'", which hid the mistake; its ChoiceField answered
    ``"True" is not a valid choice`` and its serializers "Expected a dictionary, but got list":
    Python's words. Its IntegerField read ``"5"`` as 5 and its BooleanField ``"yes"``, ``"on"``
    and ``1`` as true: what a form sends, not JSON. A field given another JSON type (``_type_error``)
    is a 400 that says which type is expected (``A string is expected, not a number.``, ``An
    integer is expected, not a string.``, ``true or false is expected, not a number.``); a body or
    nested object that is no object says so in JSON's words. Null is left to each field's
    ``allow_null``. Mixed into ``StrictSerializer`` and into simplejwt's serializers (login, refresh).
    """

    def to_internal_value(self, data: Any) -> Any:
        """Refuse a non-object and values of the wrong JSON type (``_type_error``), then validate as usual."""
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {api_settings.NON_FIELD_ERRORS_KEY: [f"A JSON object is expected, not {json_type_name(data)}."]},
                code="invalid",
            )
        wrong_types = {
            name: [message]
            for name, f in self.fields.items()
            if not f.read_only and name in data and data[name] is not None
            if (message := _type_error(f, data[name])) is not None
        }
        if wrong_types:
            raise serializers.ValidationError(wrong_types)
        return super().to_internal_value(data)


class StrictSerializer(StrictTextMixin, serializers.Serializer):
    """Reject fields the endpoint does not know, and what ``StrictTextMixin`` rejects."""

    def to_internal_value(self, data: Any) -> Any:
        """Refuse unknown keys, then check text fields (``StrictTextMixin``) and validate as usual."""
        if isinstance(data, dict):
            writable = {name for name, f in self.fields.items() if not f.read_only}
            unknown = sorted(set(data) - writable)
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


PRIVILEGE_FIELDS = ("role", "is_staff", "is_superuser")  # what registration refuses with PRIVILEGE_MESSAGE
PRIVILEGE_MESSAGE = "cannot be chosen at registration; an admin grants roles."


class RegisterSerializer(StrictSerializer):
    """Body of POST /api/auth/register. A ``role`` (or a staff flag) is refused: registration is always USER."""

    username = serializers.RegexField(r"^[\w.@+-]{3,150}$", max_length=150)
    password = serializers.CharField(write_only=True, max_length=128, trim_whitespace=False)
    email = serializers.EmailField(required=False, allow_blank=True, default="")

    def to_internal_value(self, data: Any) -> Any:
        """Refuse ``role`` and the staff flags with a message that says why, before strict validation.

        Any value is refused, ``"USER"`` too: a client that sends one believes it chooses, and
        silently ignoring it (as this endpoint once did) hid that it does not.
        """
        if isinstance(data, dict):
            chosen = [name for name in PRIVILEGE_FIELDS if name in data]
            if chosen:
                raise serializers.ValidationError({name: [PRIVILEGE_MESSAGE] for name in chosen})
        return super().to_internal_value(data)

    def validate_username(self, value: str) -> str:
        """Refuse a username that is taken (case-insensitively)."""
        if User.objects.filter(username__iexact=value).exists():
            raise serializers.ValidationError("A user with that username already exists.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Run Django's password validators against the would-be user."""
        from django.core.exceptions import ValidationError as DjangoValidationError

        try:
            validate_password(attrs["password"], user=User(username=attrs["username"], email=attrs.get("email", "")))
        except DjangoValidationError as exc:
            raise serializers.ValidationError({"password": list(exc.messages)}) from exc
        return attrs


class UserSerializer(serializers.ModelSerializer):
    """A user as the API shows it."""

    # Not an EmailField: registration allows no email, and "" is no valid "format: email".
    email = serializers.CharField(read_only=True, help_text="Email address, or empty when none was given.")

    class Meta:
        model = User
        fields = ["id", "username", "email", "role", "date_joined"]
        read_only_fields = fields


class LogoutSerializer(StrictSerializer):
    """Body of POST /api/auth/logout."""

    refresh = serializers.CharField()


# simplejwt looks a refresh token's user up with ``objects.get`` and lets ``DoesNotExist`` escape
# (a 500): an account an operator deletes leaves its refresh tokens valid and unblacklisted
# (``OutstandingToken.user`` becomes NULL). Such a token is refused as a deactivated account's is.
# The class keeps simplejwt's name, so the schema's ``TokenRefresh`` components keep theirs.
class TokenRefreshSerializer(StrictTextMixin, jwt_serializers.TokenRefreshSerializer):
    """Body of POST /api/auth/refresh: a refresh token of an active account, rotated; 401 otherwise."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, str]:
        """Rotate as simplejwt does; a token whose user no longer exists is ``AuthenticationFailed``."""
        try:
            return super().validate(attrs)
        except User.DoesNotExist:
            raise AuthenticationFailed(self.error_messages["no_active_account"], "no_active_account") from None


class TokenObtainPairSerializer(StrictTextMixin, jwt_serializers.TokenObtainPairSerializer):
    """Body of POST /api/auth/login: simplejwt's, refusing a username or password that is no string.

    Named as simplejwt's, so the schema's ``TokenObtainPair`` components keep their names.
    """
