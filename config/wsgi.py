"""WSGI entry point for the web process (gunicorn config.wsgi).

``application`` is Django's, behind one guard: a ``Content-Type`` holding a control character
(``charset=utf-8\\x00``) is answered 400 before Django parses it. Django builds its request from
the header first thing, and ``codecs.lookup`` of a charset with a NUL raises ``ValueError``
there, before any middleware runs: a 500 on every URL. gunicorn refuses such a header itself
("Invalid HTTP Header"); ``manage.py runserver`` and other servers pass it on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

_django = get_wsgi_application()

from core.errors import error_body  # noqa: E402 - the API's error shape; after Django is set up

_BAD_CONTENT_TYPE = json.dumps(
    error_body(code="validation_error", message="The Content-Type header holds a control character.")
).encode()


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """The WSGI callable (PEP 3333): Django's, after the Content-Type guard above."""
    content_type = environ.get("CONTENT_TYPE", "")
    if any(ord(c) < 32 or ord(c) == 127 for c in content_type):
        start_response(
            "400 Bad Request",
            [("Content-Type", "application/json"), ("Content-Length", str(len(_BAD_CONTENT_TYPE)))],
        )
        return [_BAD_CONTENT_TYPE]
    return _django(environ, start_response)
