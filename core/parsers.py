"""The API's JSON parser and the forms' JSON reader: hostile JSON is a 400 or a form error, never a 500.

Every API body is bounded (``api_body_limit()``, the ``API_MAX_BODY_BYTES`` setting): an oversized
one is the JSON 413, whether it declares its length (refused before a byte is read) or streams it
chunked (at most limit + 1 bytes are read). ``core.body_limit`` answers the same 413 before any
middleware reads the body.

Python's json module accepts text that Stint cannot use: nesting a few KB deep (it recurses per
level: RecursionError), integers past 4,300 digits (ValueError), and ``\\ud800``-style escapes
of a lone UTF-16 surrogate, which are valid JSON but no valid Unicode: nothing can encode them
as UTF-8 (the payload's size, psycopg), so unchecked they would surface as a UnicodeEncodeError (500).

``json_loads`` parses for both readers and says in its own words what is wrong: the json
module's and the codecs' messages name Python's internals (``sys.set_int_max_str_digits()``,
``decode using utf-8-sig``, ``'ascii' codec can't decode``), which tell an API client nothing.
"""

from __future__ import annotations

import codecs
import json
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.utils.http import parse_header_parameters
from rest_framework.exceptions import APIException, ParseError, UnsupportedMediaType
from rest_framework.parsers import JSONParser

MAX_JSON_DEPTH = 64  # levels of nested arrays/objects accepted in a request body
SURROGATE_MESSAGE = "JSON text must be valid Unicode: a lone UTF-16 surrogate (\\ud800-\\udfff) cannot be stored."


def json_depth(value: Any) -> int:
    """Return how deeply ``value`` nests lists and dicts (0 for a scalar), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
            deepest = max(deepest, depth + 1)
        elif isinstance(item, list | tuple):  # a tuple is a JSON array too (json.dumps writes it so)
            stack.extend((v, depth + 1) for v in item)
            deepest = max(deepest, depth + 1)
    return deepest


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def json_strings(value: Any) -> Iterator[str]:
    """Yield every string inside JSON ``value`` (object keys included), without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


# Python's default limit on the digits of an integer read from text (CVE-2020-10735), which every
# process that reads a job back keeps. A process may lift it (``sys.set_int_max_str_digits(0)``, a
# handler's code say) and then write JSON that PostgreSQL stores and no other process can read.
MAX_INT_DIGITS = sys.int_info.default_max_str_digits  # 4,300
_FIRST_TOO_LONG = 10**MAX_INT_DIGITS  # the smallest integer of MAX_INT_DIGITS + 1 digits
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_TOO_MANY_DIGITS = b"0" * (MAX_INT_DIGITS + 1)


def has_long_integer(text: str, value: Any) -> bool:
    """True when JSON ``value`` holds an integer of more than ``MAX_INT_DIGITS`` digits; ``text`` is its JSON.

    ``text`` (ASCII: encoded with ``ensure_ascii``) must then hold that many digits in a row: a
    cheap test (a few ms per MB, nothing under ``MAX_INT_DIGITS`` characters) before the walk of
    ``value``, which only a run of digits, in a number or a string, calls for. Without recursion.
    """
    if len(text) <= MAX_INT_DIGITS or _TOO_MANY_DIGITS not in text.encode("ascii", "replace").translate(
        _DIGITS_AS_ZERO
    ):
        return False
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool):
            if abs(item) >= _FIRST_TOO_LONG:
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def has_nul(value: Any) -> bool:
    """True when any string (key or value) inside JSON ``value`` contains U+0000 (PostgreSQL refuses it)."""
    return any("\x00" in text for text in json_strings(value))


def has_lone_surrogate(value: Any) -> bool:
    """True when any string (key or value) inside ``value`` holds a lone UTF-16 surrogate (U+D800-U+DFFF)."""
    return any(_has_surrogate(text) for text in json_strings(value))


def is_storable_text(text: str) -> bool:
    """True if PostgreSQL's text types can hold ``text``: no NUL (U+0000), no lone UTF-16 surrogate.

    A NUL is refused by PostgreSQL itself; a lone surrogate (U+D800-U+DFFF, from a byte that is
    not UTF-8) has no UTF-8 encoding, so it cannot even be sent.
    """
    return "\x00" not in text and not _has_surrogate(text)


def json_type_name(value: Any) -> str:
    """Return how JSON names the type of parsed ``value``, with its article: "a number", "an object", "null".

    One of "a string", "a number", "a boolean", "an array", "an object" or "null".
    Python's ``True`` is an ``int``; JSON's true is no number, so a boolean is named first.
    """
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "a string" if isinstance(value, str) else "null"


def is_json_number(value: Any) -> bool:
    """True for a parsed JSON number: an ``int`` or ``float`` that is no ``bool`` (JSON's true is no number)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def json_integer(value: Any) -> tuple[Any, str | None]:
    """Read a parsed JSON value meant as an integer: ``(value, problem)``, ``problem`` None when it is a number.

    A float with no fraction becomes its ``int`` (``5.0`` is 5, as JSON Schema's "integer" and
    DRF's IntegerField read it); None stays None (absent or null: the caller's rule). Another JSON
    type is the problem ``An integer is expected, not a string.``, the API serializers' words
    (``accounts.serializers.StrictTextMixin``). A number with a fraction is returned as it is, for
    the caller's range check to refuse.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value), None
    if value is None or is_json_number(value):
        return value, None
    return value, f"An integer is expected, not {json_type_name(value)}."


def json_problem(value: Any) -> str | None:
    """Return why parsed JSON ``value`` is refused (too deep, a lone surrogate), or None when it is fine."""
    if json_depth(value) > MAX_JSON_DEPTH:
        return f"JSON nested deeper than {MAX_JSON_DEPTH} levels."
    if has_lone_surrogate(value):
        return SURROGATE_MESSAGE
    return None


class JSONTextError(ValueError):
    """The text is not JSON that Stint can take; the message says why, in words for the sender."""


# The json module's syntax messages that read badly on their own ("... at") or are Python's words.
_SYNTAX_MESSAGES = {
    "Expecting value": "expecting a value",
    "Extra data": "extra data after the JSON value",
    "Invalid control character at": "a control character in a string must be escaped",
    "Unterminated string starting at": "unterminated string",
    "Unexpected UTF-8 BOM (decode using utf-8-sig)": "the text starts with a byte order mark",
}
BOM_MESSAGE = "the body starts with a UTF-8 byte order mark; send it without one"


def _parse_int(text: str) -> int:
    # int() refuses more digits than this (CVE-2020-10735) with a message about sys.set_int_max_str_digits().
    limit = sys.get_int_max_str_digits()
    if limit and len(text) - text.startswith("-") > limit:
        raise JSONTextError(f"a number has more than {limit} digits")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999: json.loads makes it inf, which no JSON writer or PostgreSQL takes
        raise JSONTextError("a number is too large (over 1.8e308)")
    return value


def _parse_constant(name: str) -> Any:
    raise JSONTextError(f"{name} is not a JSON number")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # RFC 8259, 4: names within an object SHOULD be unique, and what a receiver makes of a repeated
    # one is "unpredictable" (Python's json keeps the last, silently): refuse it instead.
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JSONTextError(f"the key {key[:40]!r} appears twice in one object")
            seen.add(key)
    return value


def json_loads(text: str) -> Any:
    """Parse JSON ``text`` strictly; raise JSONTextError (a ValueError) whose message a person can act on.

    Strict: NaN, Infinity, numbers beyond a double's range, integers past Python's digit limit
    (``sys.get_int_max_str_digits()``, 4,300) and a key named twice in one object (RFC 8259, 4:
    its meaning is "unpredictable") are refused, as are syntax errors (the message then
    ends with the line and column). Raises RecursionError for deep nesting (the callers know
    their limit, ``MAX_JSON_DEPTH``); never anything else.
    """
    try:
        return json.loads(
            text,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
            object_pairs_hook=_object,
        )
    except json.JSONDecodeError as exc:
        reason = _SYNTAX_MESSAGES.get(exc.msg, exc.msg)
        raise JSONTextError(f"{reason} (line {exc.lineno}, column {exc.colno})") from exc


def json_bytes_load(body: bytes, *, encoding: str) -> Any:
    """Decode ``body`` as ``encoding`` and parse it with ``json_loads``; raise JSONTextError or RecursionError.

    A byte order mark is refused by name (JSON text sent over a network has none: RFC 8259, 8.1),
    a byte the encoding cannot decode is named with its offset, and a declared charset that is
    no text encoding (``charset=rot13``, ``base64``) is refused as such.
    """
    try:
        text = body.decode(encoding)
    except LookupError as exc:  # Django drops unknown charsets, not codecs that are no text encoding
        raise JSONTextError(f"the declared charset {encoding[:40]!r} is not a text encoding") from exc
    except UnicodeDecodeError as exc:
        name = codecs.lookup(encoding).name.upper()
        raise JSONTextError(
            f"the body is not valid {name} (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
        ) from exc
    except UnicodeError as exc:  # a codec's own check (idna: an empty label)
        raise JSONTextError(f"the body is not valid {codecs.lookup(encoding).name.upper()}") from exc
    if text.startswith("\ufeff"):
        raise JSONTextError(BOM_MESSAGE)
    return json_loads(text)


def json_text_load(text: str) -> Any:
    """Parse ``text`` as JSON for a form field; raise ValueError with a message a person can act on.

    Refuses what ``json_problem`` refuses, and what ``json_loads`` refuses (syntax, NaN,
    numbers out of range, integers past Python's digit limit), and deep recursion. Never raises
    anything else.
    """
    return _checked(lambda: json_loads(text), error=ValueError, syntax="Not valid JSON")


def _checked(load: Callable[[], Any], *, error: type[Exception], syntax: str) -> Any:
    """Return ``load()``'s JSON value if Stint can use it; raise ``error`` with a message a person can act on.

    The one refusal rule of both readers: ``"<syntax>: <what json_loads said>."`` for text that
    is no JSON, a depth message for nesting Python cannot parse, and ``json_problem``'s for a
    value it can parse but Stint cannot store.
    """
    try:
        value = load()
    except JSONTextError as exc:
        raise error(f"{syntax}: {exc}.") from exc
    except RecursionError as exc:
        raise error(f"JSON nested deeper than {MAX_JSON_DEPTH} levels.") from exc
    problem = json_problem(value)
    if problem:
        raise error(problem)
    return value


def api_body_limit() -> int:
    """Return the largest API request body in bytes: ``settings.API_MAX_BODY_BYTES`` (64 KB by default).

    The project derives it from the job payload limit (config/settings.py): the exact payload
    rule is the job service's, this only bounds what is read.
    """
    return settings.API_MAX_BODY_BYTES


class RequestBodyTooLarge(APIException):
    """The request body is over the API's limit."""

    status_code = 413
    default_detail = "The request body is over the limit."
    default_code = "payload_too_large"


def body_too_large(declared: int | None = None) -> RequestBodyTooLarge:
    """Return the 413 error (``RequestBodyTooLarge``, code ``payload_too_large``) for an oversized body."""
    limit = api_body_limit()
    if declared is not None:
        return RequestBodyTooLarge(f"The request body is {declared} bytes; the limit is {limit} bytes.")
    return RequestBodyTooLarge(f"The request body is over the limit of {limit} bytes.")


def declared_charset(request: Any) -> str | None:
    """Return the ``charset`` of ``request``'s Content-Type (None when it names none); raise 415 if unusable.

    Unusable: no codec of that name (``charset=bogus``, which Django silently drops, so unchecked
    the body would be read as UTF-8 whatever the client meant), or a codec that is no text encoding
    (``rot13``, ``base64``). Both are ``UnsupportedMediaType`` (415, as Express's body-parser
    answers an unsupported charset): the body cannot be read as the client says it is written.
    """
    header = str(getattr(request, "META", {}).get("CONTENT_TYPE") or "")
    charset = parse_header_parameters(header)[1].get("charset")
    if charset is None:
        return None
    try:
        # LookupError for no codec, and for one that is no text encoding (rot13): str.decode checks
        # that before decoding, but only for a non-empty input. What a text codec makes of the
        # probe does not matter here: the body itself is decoded later, with its own messages.
        b"\x00\x00\x00\x00".decode(charset)
    except LookupError:
        raise UnsupportedMediaType(
            header.split(";")[0].strip()[:100],
            detail=f"Unsupported charset {charset[:40]!r} in Content-Type: send UTF-8, or name a text encoding "
            "such as latin-1.",
        ) from None
    except Exception:  # noqa: S110 - a text codec's complaint about the probe bytes, see above
        pass
    return charset


class SafeJSONParser(JSONParser):
    """DRF's JSON parser, bounded to ``api_body_limit()`` (413), refusing with 400 a body nested
    deeper than ``MAX_JSON_DEPTH`` or holding a lone surrogate, and parsing with ``json_bytes_load``
    (always strict, whatever ``STRICT_JSON`` says) so that a 400's message is ours, not Python's.

    DRF reads the body stream itself, so Django's DATA_UPLOAD_MAX_MEMORY_SIZE does not apply here:
    the declared Content-Length is refused up front and at most limit + 1 bytes are ever read.
    Python's json module recurses per level, so a body a few KB long but ~1000 levels deep would
    otherwise raise RecursionError (a 500), and later crash every piece of code that walks it.
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        """Refuse an oversized body (413), parse, then check depth and text (ParseError, 400)."""
        limit = api_body_limit()
        request = (parser_context or {}).get("request")
        try:
            declared = int(getattr(request, "META", {}).get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            raise body_too_large(declared)
        body = stream.read(limit + 1) if stream is not None else b""
        if len(body) > limit:
            raise body_too_large()
        encoding = declared_charset(request) or (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        return _checked(lambda: json_bytes_load(body, encoding=encoding), error=ParseError, syntax="JSON parse error")
