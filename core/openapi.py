"""Document the API's shared error responses (the envelope of core.errors, 429 headers) on every operation.

A drf-spectacular postprocessing hook (``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``), so views
document only their own success and domain responses (e.g. 409) and the schema still tells
clients, and schemathesis, every status the framework itself can answer with.
"""

from __future__ import annotations

from typing import Any

ERROR_COMPONENT = "ErrorEnvelope"
ERROR_REF = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "details": {"nullable": True},
            },
            "required": ["code", "message", "details"],
        }
    },
    "required": ["error"],
}
RATE_LIMIT_HEADERS: dict[str, Any] = {
    "X-RateLimit-Limit": {"schema": {"type": "integer"}, "description": "Requests allowed per window."},
    "X-RateLimit-Remaining": {"schema": {"type": "integer"}, "description": "Requests left in the window."},
    "X-RateLimit-Reset": {
        "schema": {"type": "integer"},
        "description": "Seconds until the oldest counted request leaves the window.",
    },
}
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

# status: (description, applies to the operation?)
_GENERIC: dict[str, tuple[str, Any]] = {
    "400": ("Validation error.", lambda op: "requestBody" in op or op.get("parameters")),
    "401": ("Missing, invalid or expired credentials.", lambda op: True),
    "403": ("Not allowed.", lambda op: True),
    # A path parameter names a resource; DRF's page-number pagination answers 404 to a page past the end.
    "404": (
        "Not found.",
        lambda op: any(p.get("in") == "path" or p.get("name") == "page" for p in op.get("parameters", [])),
    ),
    "413": ("Payload too large.", lambda op: "requestBody" in op),
    "415": ("Unsupported media type.", lambda op: "requestBody" in op),
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": dict(ERROR_REF)}}}


def _throttled_operations(generator: Any) -> set[tuple[str, str]]:
    throttled = set()
    for path, _regex, method, callback in getattr(generator, "endpoints", None) or []:
        view_class = getattr(callback, "cls", None)
        if view_class is not None and getattr(view_class, "throttle_classes", None):
            throttled.add((path, method.lower()))
    return throttled


def document_error_responses(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """Add the error envelope (and 429 with its headers on throttled operations) where a view left it out.

    Never replaces a response a view documented itself.
    """
    result.setdefault("components", {}).setdefault("schemas", {})[ERROR_COMPONENT] = ERROR_SCHEMA
    throttled = _throttled_operations(generator)
    for path, item in result.get("paths", {}).items():
        for method in HTTP_METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            responses = operation.setdefault("responses", {})
            for status, (description, applies) in _GENERIC.items():
                if status not in responses and applies(operation):
                    responses[status] = _error(description)
            if (path, method) in throttled:
                for response in responses.values():
                    if "$ref" not in response:
                        response.setdefault("headers", {}).update(
                            {k: v for k, v in RATE_LIMIT_HEADERS.items() if k not in response.get("headers", {})}
                        )
                responses.setdefault(
                    "429",
                    {
                        **_error("Rate limited; retry after the number of seconds in Retry-After."),
                        "headers": {
                            "Retry-After": {"schema": {"type": "integer"}, "required": True},
                            **RATE_LIMIT_HEADERS,
                        },
                    },
                )
    return result
