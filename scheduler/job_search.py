"""Parse and apply the job search qualifiers (``args.<path>:<value>``, ``error:<text>``) of the console, API and pages.

The syntax is Oban Web's filter bar's, for the two questions its qualifiers answer that a name
search cannot: "which jobs were about customer 7" (``args.customer:7``, a path into the payload,
dotted for nested objects: ``args.user.plan:pro``) and "which jobs failed with this error"
(``error:timeout``, part of ``last_error``, in any letter case). Terms are separated by spaces and
all must hold; a value with spaces is quoted (``error:"No such customer"``). A qualifier's name
is read in any letter case (``Error:x``, ``ARGS.customer:7``); the payload keys after ``args.``
and the value keep theirs. What is left over is the plain text (``jobs_filter_by_list_search``).

A payload value matches as JSON containment (``payload @> {...}``): ``args.customer:7`` finds
``{"customer": 7}``, ``{"customer": "7"}`` and ``{"customer": [7, 8]}``; a quoted value
(``args.customer:"7"``) is text only. Nothing here raises on odd input: a term that cannot be a
qualifier (an unbalanced quote, an ``args`` term with no value (``args.customer:``; a quoted
``""`` is the empty string), a path of 0 or more than ``MAX_PATH_DEPTH`` keys, text
PostgreSQL cannot hold) is reported in ``JobSearch.problems`` and matches no job, as does a search
of more than ``MAX_TERMS`` terms.

``GET /api/jobs?search=``, ``GET /api/admin/jobs?search=`` and the user pages' job list read the
same syntax through ``JobSearchField`` (at most ``SEARCH_MAX`` characters; a problem is a
validation error, so the API answers 400 and the page shows it); the console reads it with
``job_search_parse`` (a problem is a message). All of them apply it with
``jobs_filter_by_list_search``, one rule for the plain text: a job's full id, 8 to 32 hex digits
from either end of it, its exact idempotency key, or part of its name, type or last error in any
letter case. Whose jobs are searched is the caller's queryset (an owner's own, an admin's all).
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db.models import CharField, F, Func, Q, QuerySet, Value
from django.db.models.functions import Cast, Replace, Upper
from django.db.models.lookups import Contains, EndsWith, StartsWith

from core.parsers import is_storable_text

ARGS_PREFIX = "args."
ERROR_PREFIX = "error:"
MAX_PATH_DEPTH = 8  # keys in one args path (a payload nests at most core.parsers.MAX_JSON_DEPTH)
MAX_TERM_CHARS = 1000  # characters of one qualifier's value: longer never matches a 10 KB payload key usefully
MAX_TERMS = 20  # space-separated terms in one search: each is a filter, and 10,000 took minutes to build
SEARCH_MAX = 200  # characters of a search the API and the user pages take (after stripping)
ID_DIGITS_MIN = 8  # hex digits of a partial id: the lists show the last 8 (scheduler.ids.short_job_id)
HEX_DIGITS = frozenset("0123456789abcdef")


@dataclass(slots=True, kw_only=True)
class ArgsTerm:
    """One ``args.<path>:<value>`` term: the payload keys from the top, and the values that match."""

    path: tuple[str, ...]
    values: tuple[Any, ...]  # JSON values; a match is any of them at ``path``, or in an array there


@dataclass(slots=True, kw_only=True)
class JobSearch:
    """A parsed search: qualifier terms, the plain text left over, and terms that could not be read."""

    args: list[ArgsTerm] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # last_error must contain each (case-insensitive)
    plain: str = ""
    problems: list[str] = field(default_factory=list)  # why a term was refused; a refused term matches nothing

    @property
    def qualified(self) -> bool:
        """True when the search has at least one qualifier term (or a refused one)."""
        return bool(self.args or self.errors or self.problems)


def _scalar(text: str) -> Any:
    """The JSON number, boolean or null ``text`` spells, else None (meaning: text only)."""
    if text in ("true", "false", "null"):
        return json.loads(text)
    try:
        number = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, an integer past Python's digit limit, nesting past the stack
        return None
    if isinstance(number, bool) or not isinstance(number, int | float):
        return None
    if isinstance(number, float) and not math.isfinite(number):  # "1e999" is inf: no JSON for it
        return None
    return number


_TOKEN = re.compile(r'(?P<key>[^\s"]+:)"(?P<quoted>[^"]*)"(?=\s|$)|(?P<bare>\S+)')


def _split(term: str) -> list[tuple[str, bool]] | None:
    """Split ``term`` on spaces, keeping a ``key:"quoted value"`` together; each piece with whether it was quoted.

    None when a qualifier's quote does not close.
    """
    pieces: list[tuple[str, bool]] = []
    for match in _TOKEN.finditer(term):
        if match["bare"] is None:
            pieces.append((match["key"] + match["quoted"], True))
        elif '"' in match["bare"].partition(":")[2][:1]:
            return None
        else:
            pieces.append((match["bare"], False))
    return pieces


def _qualifier(piece: str) -> str:
    """``ARGS_PREFIX`` or ``ERROR_PREFIX`` when ``piece`` starts with one in any ASCII letter case, else ""."""
    for prefix in (ERROR_PREFIX, ARGS_PREFIX):
        head = piece[: len(prefix)]
        if head.isascii() and head.lower() == prefix:
            return prefix
    return ""


def job_search_parse(term: str) -> JobSearch:
    """Parse the console's search box text into qualifier terms and plain text.

    ``term``: what the operator typed (any text; already stripped or not). Returns a
    ``JobSearch``; never raises. Rules: the module docstring (Oban Web's filter syntax).
    """
    search = JobSearch()
    if not is_storable_text(term):
        search.problems.append("The search holds a character PostgreSQL cannot store (NUL or a lone surrogate).")
        return search
    if len(term.split()) > MAX_TERMS:  # before splitting: a quoted value's spaces may over-count, never under
        pieces = _split(term)
        count = len(pieces) if pieces is not None else len(term.split())
        if count > MAX_TERMS:
            search.problems.append(f"A search takes at most {MAX_TERMS} terms; this one has {count}.")
            return search
    lowered = term.lower()  # may over-find a qualifier (never under): each piece is checked below
    if ARGS_PREFIX not in lowered and ERROR_PREFIX not in lowered:
        search.plain = term.strip()
        return search
    pieces = _split(term)
    if pieces is None:
        if term.count('"') % 2:
            search.problems.append("A quote in the search is not closed.")
        else:  # every quote closed: text follows a closing quote (args.x:"a"b)
            search.problems.append(
                "A quoted value ends at its closing quote: put a space after it, or quote all of it."
            )
        return search
    plain: list[str] = []
    for piece, quoted in pieces:
        qualifier = _qualifier(piece)
        if qualifier == ERROR_PREFIX:
            text = piece[len(ERROR_PREFIX) :]
            if not text or len(text) > MAX_TERM_CHARS:
                search.problems.append(
                    f"An error: term wants 1 to {MAX_TERM_CHARS} characters of error text after the colon."
                )
            else:
                search.errors.append(text)
        elif qualifier == ARGS_PREFIX:
            path_text, colon, value = piece[len(ARGS_PREFIX) :].partition(":")
            path = tuple(path_text.split("."))
            if not colon or not all(path) or len(path) > MAX_PATH_DEPTH or len(value) > MAX_TERM_CHARS:
                search.problems.append(
                    f"{piece[:80]!r} is not args.<key>[.<key>...]:<value> (at most {MAX_PATH_DEPTH} keys, "
                    f"a value of at most {MAX_TERM_CHARS} characters)."
                )
                continue
            if not value and not quoted:  # typed, not finished: it would match only "" silently
                search.problems.append(
                    f'{piece[:80]!r} has no value: write one after the colon ({piece[:80]}"" for the empty string).'
                )
                continue
            # A quoted value is text only, "null" too; unquoted, null is the one scalar that is None.
            scalar = None if quoted else _scalar(value)
            values = (value,) if quoted or (scalar is None and value != "null") else (scalar, value)
            search.args.append(ArgsTerm(path=path, values=values))
        else:
            plain.append(piece)
    search.plain = " ".join(plain)
    return search


def error_term(text: str) -> str:
    """Return the ``error:`` term that ``job_search_parse`` reads back as ``text``, or "" when none can.

    Quoted when ``text`` holds whitespace (the search splits on any); none for an empty text or
    one holding a double quote, which the syntax cannot quote.
    """
    if not text or '"' in text:
        return ""
    return f'{ERROR_PREFIX}"{text}"' if any(c.isspace() for c in text) else f"{ERROR_PREFIX}{text}"


def _case_forms(char: str) -> set[str]:
    """``char`` and each one-character lower, upper or title case form reachable from it: {"Ä", "ä"} for "ä"."""
    forms, todo = {char}, [char]
    while todo:
        current = todo.pop()
        for form in (current.lower(), current.upper(), current.title()):
            if len(form) == 1 and form not in forms:
                forms.add(form)
                todo.append(form)
    return forms


def _fold_target(char: str) -> str:
    """The one form the case forms of ``char`` are folded to: upper case of its lower case ("I" for "ı")."""
    for form in (char.lower().upper(), char.upper()):
        if len(form) == 1:
            return form
    return char


def case_fold_map(text: str) -> dict[str, str]:
    """Return how to fold the non-ASCII letters of ``text`` to one case: each case form to one target letter.

    Only the letters ``text`` holds, and only forms beyond ASCII (PostgreSQL's ``UPPER()`` folds
    ASCII under any locale): {"ä": "Ä", "ı": "I"} for "Ärger ı". A form two letters share (the
    first of them wins) is folded as the first one says, on both sides alike.
    """
    fold: dict[str, str] = {}
    for char in text:
        if char.isascii():
            continue
        target = _fold_target(char)
        for form in sorted(_case_forms(char)):
            if form != target and not form.isascii():
                fold.setdefault(form, target)
    return fold


def _contains_any_case(field: str, text: str) -> Q:
    """``field`` holds ``text`` in any letter case, beyond ASCII too; every character is literal.

    Django's ``icontains`` is ``UPPER(field) LIKE UPPER(text)``, and PostgreSQL's ``UPPER()`` folds
    by the database's locale: under none (``C``, the dev stack's ``initdb --no-locale``) only ASCII
    letters, so ``error:ÄRGER`` missed "ärger". Here both sides first have the letters of ``text``
    folded (``case_fold_map``: SQL ``translate()``, short as the text's distinct letters), then go
    through ``UPPER()``; a regular expression of case brackets was tried and took seconds per
    kilobyte of error text. A letter whose upper case is two letters ("ß": "SS") matches its
    one-letter forms only.
    """
    fold = case_fold_map(text)
    column: Any = F(field)
    if fold:
        column = Func(column, Value("".join(fold)), Value("".join(fold.values())), function="translate")
    folded = "".join(char.upper() if char.isascii() else char for char in text.translate(str.maketrans(fold)))
    return Q(Contains(Upper(column, output_field=CharField()), folded))


def _nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """``{"a": {"b": value}}`` for path ("a", "b")."""
    nested: Any = value
    for key in reversed(path):
        nested = {key: nested}
    return nested


def jobs_filter_by_search(queryset: QuerySet[Any], search: JobSearch) -> QuerySet[Any]:
    """Narrow a ``Job`` queryset to the jobs every qualifier term of ``search`` matches (plain text excluded).

    ``args`` terms are JSON containment on ``payload`` (the value at the path, or in an array
    there); ``error`` terms are ``last_error`` substrings in any letter case (``_contains_any_case``). A search with
    ``problems`` matches no job. Neither is indexed: the console pages its results by the
    ``job_recent`` index, and the count scans the jobs the other filters leave.
    """
    if search.problems:
        return queryset.none()
    for term in search.args:
        match = Q()
        for value in term.values:
            match |= Q(payload__contains=_nest(term.path, value)) | Q(payload__contains=_nest(term.path, [value]))
        queryset = queryset.filter(match)
    for text in search.errors:
        queryset = queryset.filter(_contains_any_case("last_error", text))
    return queryset


def plain_text_q(text: str) -> Q:
    """Return the condition a job meets when the plain text ``text`` finds it (not empty; any characters).

    A full id (any spelling ``uuid.UUID`` reads) finds the job with that id or that exact
    idempotency key: an index lookup, nothing else. Other text finds a job when it is its exact
    idempotency key, 8 to 32 hex digits from either end of its id (hyphens ignored, any case: the
    lists show the last 8, and a pasted start also finds the jobs made in the same stretch of time,
    as a version 7 id starts with its time), or part of its name, type or last error in any letter
    case, beyond ASCII too (``_contains_any_case``; every character is literal). The one rule of
    the API, the user pages and the console.
    """
    try:
        return Q(id=uuid.UUID(text)) | Q(idempotency_key=text)
    except ValueError:
        pass
    found = (
        Q(idempotency_key=text)
        | _contains_any_case("name", text)
        | _contains_any_case("type", text)
        | _contains_any_case("last_error", text)
    )
    digits = text.lower().replace("-", "")
    if ID_DIGITS_MIN <= len(digits) <= 32 and HEX_DIGITS.issuperset(digits):
        hex_id = Replace(Cast("id", output_field=CharField()), Value("-"), Value(""))
        found |= Q(StartsWith(hex_id, digits)) | Q(EndsWith(hex_id, digits))
    return found


def jobs_filter_by_list_search(queryset: QuerySet[Any], search: JobSearch) -> QuerySet[Any]:
    """Narrow a ``Job`` queryset to the jobs ``search`` finds: the API's job lists, the user pages and the console.

    Every qualifier must hold (``jobs_filter_by_search``) and the plain text, when any, finds the
    job (``plain_text_q``: id, idempotency key, or part of the name, type or last error). A search
    with ``problems`` matches no job. Visibility is the caller's: ``queryset`` is already the jobs
    the user may see, so an owner never finds another user's job by its id, key or error.
    """
    queryset = jobs_filter_by_search(queryset, search)
    if search.plain:
        queryset = queryset.filter(plain_text_q(search.plain))
    return queryset


class JobSearchField(forms.CharField):
    """A job search box (API query parameter or page form field), cleaned to a ``JobSearch``, or None when blank.

    At most ``SEARCH_MAX`` characters once stripped. A term ``job_search_parse`` cannot read (an
    unclosed quote, ``args.`` without a key or a value, more than ``MAX_TERMS`` terms, a NUL or a
    lone surrogate) is a ``ValidationError`` carrying each of its problems: the API's 400, the
    page's field error.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", SEARCH_MAX)
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def clean(self, value: Any) -> JobSearch | None:
        """Check the text as ``CharField`` does, then parse it; None for blank text."""
        text = super().clean(value)
        if not text:
            return None
        search = job_search_parse(text)
        if search.problems:
            raise ValidationError(search.problems, code="invalid")
        return search
