"""Stored JSON that Python cannot read: a model field that reads such a value as ``UnreadableJSON`` instead of raising.

PostgreSQL's ``jsonb`` holds values that Python's json module refuses: an integer of more than
4,300 digits (``sys.get_int_max_str_digits()``: ValueError) and nesting deeper than the
interpreter's recursion limit (RecursionError). Stint never writes them (``jobspec.payload_json``
refuses both), so such a row was edited by hand or by SQL; Django's ``JSONField.from_db_value``
let the error out, and every page, list and API answer that loaded the row was a 500.
``StoredJSONField`` reads such a value as an ``UnreadableJSON`` that says why; the pages, the
console and the API show that in its place (``pretty_json``, ``str()``, the API's ``unreadable``),
and saving the row writes the stored text back unchanged. The worker's claim decodes payloads
itself (``lifecycle.UnreadablePayload``): this field is not on that path.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

from django.db import models
from psycopg.types.json import Jsonb


@dataclass(frozen=True, slots=True)
class UnreadableJSON:
    """A stored JSON value that Python's json cannot read; ``why`` says so in a person's words.

    ``text`` is the value as PostgreSQL returned it (jsonb's text), kept so that saving the row
    writes it back unchanged instead of losing it.
    """

    why: str
    text: str = field(repr=False)

    def __str__(self) -> str:
        return f"(cannot be read: {self.why})"


def unreadable_why(exc: BaseException) -> str:
    """Say why json could not read a stored value (``exc``: the ValueError or RecursionError it raised).

    The json module's own messages name Python's internals (``sys.set_int_max_str_digits()``,
    "maximum recursion depth exceeded"), which tell a reader of the page nothing.
    """
    if isinstance(exc, RecursionError):
        return "it nests deeper than Python can read"
    if "digits" in str(exc):
        return f"it holds a number of more than {sys.get_int_max_str_digits()} digits"
    return str(exc)[:200]


def read_stored(text: str) -> Any:
    """``text`` (jsonb as PostgreSQL prints it) decoded by json, or an ``UnreadableJSON`` saying why not.

    For readers that fetch jsonb as text outside the ORM (raw SQL); ``StoredJSONField`` does the
    same for model fields.
    """
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        return UnreadableJSON(why=unreadable_why(exc), text=text)


def _as_is(text: str) -> str:
    return text


class StoredJSONField(models.JSONField):
    """``models.JSONField`` that reads a value Python cannot parse as ``UnreadableJSON`` rather than raising.

    Costs nothing on a value that parses (one ``try``). Deconstructs as ``models.JSONField``:
    the column and every migration are unchanged, and no migration names this class.
    """

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        """Decode as ``JSONField`` does; a value json refuses is an ``UnreadableJSON``."""
        try:
            return super().from_db_value(value, expression, connection)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is handled by the parent
            return UnreadableJSON(why=unreadable_why(exc), text=value)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        """Adapt as ``JSONField`` does; an ``UnreadableJSON`` is written back as the text it was read from."""
        if isinstance(value, UnreadableJSON):
            return Jsonb(value.text, dumps=_as_is)
        return super().get_db_prep_value(value, connection, prepared)

    def deconstruct(self) -> tuple[str, str, list[Any], dict[str, Any]]:
        """Deconstruct as ``django.db.models.JSONField`` (the same column: no migration)."""
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs
