"""The console's user pages (``accounts.admin.UserAdmin``). Django's test client, a real database."""

from __future__ import annotations

import html as html_lib
import re

import pytest
from django.contrib.admin.models import LogEntry

from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db


def _form_data(page: str) -> dict[str, str]:
    """The values a browser would post back from the change form in ``page``, unchanged."""
    data: dict[str, str] = {}
    for tag in re.findall(r"<input[^>]*>", page):
        name, value, kind = (re.search(rf'{a}="([^"]*)"', tag) for a in ("name", "value", "type"))
        if name is None or (kind and kind.group(1) in ("submit", "button")):
            continue
        if kind and kind.group(1) == "checkbox":
            if " checked" in tag:
                data[name.group(1)] = "on"
            continue
        data[name.group(1)] = html_lib.unescape(value.group(1)) if value else ""
    for name, options in re.findall(r'<select[^>]*name="([^"]+)"[^>]*>(.*?)</select>', page, re.S):
        chosen = re.search(r'<option value="([^"]*)"[^>]*selected', options)
        if chosen:
            data[name] = chosen.group(1)
    return data


def test_saving_a_user_unchanged_changes_and_logs_nothing(client, admin_user):
    # A new-user walkthrough saved a user without touching it and the history said "Changed Date joined."
    # The form's split date and time inputs hold whole seconds: saving them wrote date_joined back
    # without its microseconds, a change nobody made.
    client.force_login(admin_user)
    member = UserFactory()
    joined = type(member).objects.values_list("date_joined", flat=True).get(pk=member.pk)
    assert joined.microsecond  # (the test means something only when there are microseconds to lose)
    url = f"/admin/accounts/user/{member.pk}/change/"

    response = client.post(url, _form_data(client.get(url).content.decode()))

    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    (entry,) = LogEntry.objects.filter(object_id=str(member.pk))
    assert entry.get_change_message() == "No fields changed."
    assert type(member).objects.values_list("date_joined", flat=True).get(pk=member.pk) == joined
    assert "Date joined" in client.get(url).content.decode()  # still shown, read-only
