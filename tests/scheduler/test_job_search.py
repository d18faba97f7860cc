"""The console's job search qualifiers (``scheduler.job_search``): Oban Web's ``args.<path>:<value>`` and ``error:``.

Parsing is pure; matching runs against a real database (JSON containment, ``last_error``)."""

from __future__ import annotations

import uuid

import pytest
from django.core.exceptions import ValidationError

from scheduler.job_search import (
    MAX_PATH_DEPTH,
    MAX_TERM_CHARS,
    MAX_TERMS,
    SEARCH_MAX,
    JobSearchField,
    job_search_parse,
    jobs_filter_by_list_search,
    jobs_filter_by_search,
)
from scheduler.models import Job
from tests.support.factories import JobFactory


def test_plain_text_is_left_as_it_was():
    search = job_search_parse("  quarterly report ")

    assert (search.args, search.errors, search.plain, search.problems) == ([], [], "quarterly report", [])
    assert not search.qualified


def test_qualifiers_and_plain_text_mix():
    search = job_search_parse('args.user.plan:pro error:"No such customer" nightly')

    assert [(t.path, t.values) for t in search.args] == [(("user", "plan"), ("pro",))]
    assert search.errors == ["No such customer"]
    assert search.plain == "nightly"


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("7", (7, "7")),
        ("2.5", (2.5, "2.5")),
        ("true", (True, "true")),
        ("null", (None, "null")),
        ('"7"', ("7",)),  # quoted: text only
        ('"null"', ("null",)),  # quoted null too: the text, not JSON null
        ('"true"', ("true",)),
        ("1e999", ("1e999",)),  # no finite JSON number: text only
        ("9" * 999, (int("9" * 999), "9" * 999)),
        ("INV-77", ("INV-77",)),
        ("[" * MAX_TERM_CHARS, ("[" * MAX_TERM_CHARS,)),  # past the recursion limit as JSON: text only
    ],
)
def test_an_args_value_is_the_json_scalar_it_spells_and_its_text(text, values):
    (term,) = job_search_parse(f"args.k:{text}").args

    assert term.values == values


@pytest.mark.parametrize(
    "term",
    [
        "args.x",  # no value
        "args.:1",  # no key
        "args.a..b:1",  # an empty key
        "args." + ".".join("k" * (MAX_PATH_DEPTH + 1)) + ":1",
        "args.k:" + "9" * (MAX_TERM_CHARS + 1),  # also past Python's int digit limit
        "error:",
        "error:" + "e" * (MAX_TERM_CHARS + 1),
        'error:"not closed',
        "args.k:1 \x00",
        "error:\ud800",
    ],
)
def test_a_term_that_cannot_be_read_is_a_problem_never_an_exception(term):
    search = job_search_parse(term)

    assert search.problems and search.qualified


@pytest.mark.django_db
def test_the_console_search_answers_a_value_nested_past_the_recursion_limit(client, admin_user):
    # The console reads up to MAX_TERM_CHARS of a value (the API and pages only SEARCH_MAX): 990
    # '[' made json.loads raise RecursionError out of the changelist, a 500.
    client.force_login(admin_user)

    response = client.get("/admin/scheduler/job/", {"q": "args.k:" + "[" * 990})

    assert response.status_code == 200


def test_an_args_term_without_a_value_says_so_and_a_quoted_empty_value_is_the_empty_string():
    # Typed and not finished, "args.customer:" matched only jobs whose customer is "", silently.
    assert job_search_parse("args.customer:").problems == [
        "'args.customer:' has no value: write one after the colon (args.customer:\"\" for the empty string)."
    ]
    quoted = job_search_parse('args.customer:""')
    assert (quoted.problems, [t.values for t in quoted.args]) == ([], [("",)])


def test_text_right_after_a_closing_quote_is_named_as_such_not_as_an_unclosed_quote():
    search = job_search_parse('args.x:"a"b')

    assert search.problems == ["A quoted value ends at its closing quote: put a space after it, or quote all of it."]


@pytest.mark.parametrize("word", ["args.customer:7", "error:timeout", "nightly"])
def test_a_search_of_more_than_max_terms_is_a_problem(word):
    # Each term is a filter on the list and its count: 10,000 of them took the console minutes of
    # CPU (every filter copies the query built so far) and PostgreSQL seconds to plan.
    assert not job_search_parse(" ".join([word] * MAX_TERMS)).problems

    search = job_search_parse(" ".join([word] * (MAX_TERMS + 1)))

    assert search.problems == [f"A search takes at most {MAX_TERMS} terms; this one has {MAX_TERMS + 1}."]
    assert search.qualified


@pytest.mark.django_db
class TestMatching:
    def _ids(self, term: str) -> set:
        return set(jobs_filter_by_search(Job.objects.all(), job_search_parse(term)).values_list("id", flat=True))

    def test_an_args_value_matches_as_number_text_or_array_member(self, user):
        number = JobFactory(owner=user, payload={"customer": 7})
        text = JobFactory(owner=user, payload={"customer": "7"})
        listed = JobFactory(owner=user, payload={"customer": [6, 7]})
        JobFactory(owner=user, payload={"customer": 8, "other": 7})

        assert self._ids("args.customer:7") == {number.id, text.id, listed.id}
        assert self._ids('args.customer:"7"') == {text.id}

    def test_a_quoted_null_is_the_text_null_only(self, user):
        json_null = JobFactory(owner=user, payload={"plan": None})
        text_null = JobFactory(owner=user, payload={"plan": "null"})

        assert self._ids("args.plan:null") == {json_null.id, text_null.id}
        assert self._ids('args.plan:"null"') == {text_null.id}

    def test_a_nested_path_and_several_terms_all_hold(self, user):
        pro = JobFactory(owner=user, payload={"user": {"plan": "pro", "id": 1}}, last_error="Timeout: 30 s")
        other = JobFactory(owner=user, payload={"user": {"plan": "pro", "id": 2}}, last_error="KeyError")
        JobFactory(owner=user, payload={"plan": "pro"})

        assert self._ids("args.user.plan:pro") == {pro.id, other.id}
        assert self._ids("args.user.plan:pro error:timeout") == {pro.id}
        assert self._ids('error:"timeout: 30"') == {pro.id}

    def test_error_text_matches_in_any_letter_case_beyond_ascii(self, user):
        # The database may have no locale (the dev stack's initdb --no-locale): UPPER() there folds ASCII only.
        upper = JobFactory(owner=user, last_error="ÄRGER IM BÜRO")
        lower = JobFactory(owner=user, last_error="ärger im büro")
        greek = JobFactory(owner=user, last_error="Σφάλμα δικτύου")
        JobFactory(owner=user, last_error="Arger")

        assert self._ids("error:ärger") == {upper.id, lower.id}
        assert self._ids("error:ÄRGER") == {upper.id, lower.id}
        assert self._ids('error:"im bÜro"') == {upper.id, lower.id}
        assert self._ids("error:ΣΦΆΛΜΑ") == {greek.id}

    @pytest.mark.parametrize(
        "text", ["%", "_", "\\", ".", ".*", "(", "[a-z]", "a|b", "^Bad", "$", "\\d", "x{2}", "' OR 1=1 --"]
    )
    def test_error_text_is_literal_text_never_a_pattern(self, user, text):
        JobFactory(owner=user, last_error="Bad input")
        literal = JobFactory(owner=user, last_error=f"Bad input: {text} here")

        assert self._ids(f'error:"{text}"') == {literal.id}

    def test_a_search_with_a_problem_matches_nothing(self, user):
        JobFactory(owner=user, payload={"k": 1})

        assert self._ids("args.k:1 args.x") == set()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("args.customer:", "has no value"),
        ("args.:1", "is not args.<key>"),
        ('error:"open', "not closed"),
        (" ".join(["x"] * (MAX_TERMS + 1)), f"at most {MAX_TERMS} terms"),
        ("x" * (SEARCH_MAX + 1), f"at most {SEARCH_MAX} characters"),
        ("a\x00b", "Null characters"),
        ("error:\ud800", "cannot store"),
        ("\ud800", "cannot store"),
    ],
)
def test_the_search_field_refuses_what_the_parser_cannot_read_saying_why(text, says):
    # The API's ``search`` parameter and the user pages' search box: a problem is a validation error.
    with pytest.raises(ValidationError) as caught:
        JobSearchField().clean(text)

    assert any(says in message for message in caught.value.messages), caught.value.messages


def test_the_search_field_cleans_to_a_parsed_search_or_none():
    field = JobSearchField()

    assert field.clean("") is None and field.clean("   ") is None
    search = field.clean("  args.k:1 nightly ")
    assert ([t.path for t in search.args], search.plain) == ([("k",)], "nightly")
    assert field.clean("x" * SEARCH_MAX).plain == "x" * SEARCH_MAX


@pytest.mark.django_db
def test_the_list_search_is_every_qualifier_and_plain_text_in_the_name_or_the_type(user):
    nightly = JobFactory(owner=user, name="Nightly", payload={"k": 1})
    report = JobFactory(owner=user, type="REPORT", payload={"k": 1})
    JobFactory(owner=user, name="nightly too", payload={"k": 2})

    def ids(term: str) -> set:
        found = jobs_filter_by_list_search(Job.objects.all(), job_search_parse(term))
        return set(found.values_list("id", flat=True))

    assert ids("args.k:1 NIGHT") == {nightly.id}
    assert ids("args.k:1 repo") == {report.id}
    assert ids("args.k:1 %") == set()  # a LIKE wildcard is a literal character
    assert ids("args.k:1") == {nightly.id, report.id}
    umlaut = JobFactory(owner=user, name="Übersicht", payload={"k": 1})
    assert ids("args.k:1 üBERSICHT") == {umlaut.id}  # any case beyond ASCII, whatever the database's locale


@pytest.mark.parametrize(
    ("text", "errors", "paths", "plain"),
    [
        ("Error:timeout", ["timeout"], [], ""),
        ("ERROR:TimeOut", ["TimeOut"], [], ""),  # the value keeps its text; matching it ignores case
        ("ARGS.customer:42", [], [("customer",)], ""),
        ('Args.User.Plan:"pro" nightly', [], [("User", "Plan")], "nightly"),  # payload keys keep their case
        ('eRRoR:"No such customer"', ["No such customer"], [], ""),
        ("errors:x", [], [], "errors:x"),  # not a qualifier name: plain text
        ("\u0130rror:x", [], [], "\u0130rror:x"),  # only ASCII letters spell a qualifier name
    ],
)
def test_qualifier_names_are_read_in_any_letter_case(text, errors, paths, plain):
    # A new user typed Error:x and ARGS.customer:42 and got a plain-text search that found nothing.
    search = job_search_parse(text)

    assert (search.errors, [t.path for t in search.args], search.plain, search.problems) == (errors, paths, plain, [])


@pytest.mark.django_db
class TestPlainText:
    """One rule for the API, the user pages and the console (``jobs_filter_by_list_search``)."""

    def _ids(self, term: str) -> set:
        found = jobs_filter_by_list_search(Job.objects.all(), job_search_parse(term))
        return set(found.values_list("id", flat=True))

    def test_plain_text_is_an_id_a_key_or_part_of_the_name_type_or_last_error_in_any_case(self, user):
        job = JobFactory(
            id=uuid.UUID("01a23351-5603-75a0-8a05-0c4f92cf1d36"),
            owner=user,
            name="Quarterly Übersicht",
            type="REPORT",
            idempotency_key="key-123",
            last_error="Ärger: bank said no",
        )
        JobFactory(id=uuid.UUID("01a23399-0000-7000-8000-000000000001"), owner=user, name="other")

        for term in (
            str(job.id),
            str(job.id).upper(),
            "01a23351-56",  # 8+ hex digits from the start
            "0c4f92cf1d36",  # or from the end (the lists show the last 8)
            "key-123",
            "quarterly",
            "ÜBERSICHT",
            "report",
            "ärger: BANK",
        ):
            assert self._ids(term) == {job.id}, term
        assert self._ids("key-12") == set()  # a key matches whole
        assert self._ids("01a2335") == set()  # fewer than 8 digits is not an id search

    @pytest.mark.parametrize("text", ["%", "_", "\\", "'", '"', "' OR 1=1 --", "a" * 2000, "\u00df", "\U0001f600"])
    def test_plain_text_is_literal_and_odd_text_finds_nothing_without_an_error(self, user, text):
        JobFactory(owner=user, name="plain", type="REPORT", last_error="Bad input")

        assert self._ids(text) == set()
