"""The API's JSON parser: a body nested too deeply is a 400, never a RecursionError and a 500."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_JSON_DEPTH = 64  # levels of nested arrays/objects accepted in a request body


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


class SafeJSONParser(JSONParser):
    """DRF's JSON parser, refusing bodies nested deeper than ``MAX_JSON_DEPTH`` with 400.

    Python's json module recurses per level, so a body a few KB long but ~1000 levels deep would
    otherwise raise RecursionError (a 500), and later crash every piece of code that walks it.
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        """Parse, then check the depth. Raises ParseError (400)."""
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels.") from exc
        if json_depth(data) > MAX_JSON_DEPTH:
            raise ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels.")
        return data
