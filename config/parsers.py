"""The API's JSON parser and the forms' JSON reader: hostile JSON is a 400 or a form error, never a 500.

Python's json module accepts text that Stint cannot use: nesting a few KB deep (it recurses per
level: RecursionError), integers past 4,300 digits (ValueError), and ``\\ud800``-style escapes
of a lone UTF-16 surrogate, which are valid JSON but no valid Unicode: nothing can encode them
as UTF-8 (the payload's size, psycopg), so they used to surface as a UnicodeEncodeError (500).
"""

from __future__ import annotations

import json
from typing import Any

from rest_framework.exceptions import ParseError
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
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
            deepest = max(deepest, depth + 1)
    return deepest


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def has_lone_surrogate(value: Any) -> bool:
    """True when any string (key or value) inside ``value`` holds a lone UTF-16 surrogate (U+D800-U+DFFF)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def json_problem(value: Any) -> str | None:
    """Return why parsed JSON ``value`` is refused (too deep, a lone surrogate), or None when it is fine."""
    if json_depth(value) > MAX_JSON_DEPTH:
        return f"JSON nested deeper than {MAX_JSON_DEPTH} levels."
    if has_lone_surrogate(value):
        return SURROGATE_MESSAGE
    return None


def json_text_load(text: str) -> Any:
    """Parse ``text`` as JSON for a form field; raise ValueError with a message a person can act on.

    Refuses what ``json_problem`` refuses, and text the parser itself cannot take (syntax,
    recursion, integers past Python's digit limit). Never raises anything else.
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).") from exc
    except RecursionError as exc:
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels.") from exc
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise ValueError(f"Not usable JSON: {exc}.") from exc
    problem = json_problem(value)
    if problem:
        raise ValueError(problem)
    return value


class SafeJSONParser(JSONParser):
    """DRF's JSON parser, refusing with 400 a body nested deeper than ``MAX_JSON_DEPTH`` or holding a lone surrogate.

    Python's json module recurses per level, so a body a few KB long but ~1000 levels deep would
    otherwise raise RecursionError (a 500), and later crash every piece of code that walks it.
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        """Parse, then check depth and text. Raises ParseError (400)."""
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels.") from exc
        problem = json_problem(data)
        if problem:
            raise ParseError(problem)
        return data
