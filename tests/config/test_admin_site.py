"""The admin site (operator console) opens only to active staff users with the ADMIN role."""

from __future__ import annotations

import pytest
from django.contrib import admin

from accounts.models import Role
from config.admin_site import StintAdminSite
from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_the_default_admin_site_is_stints():
    assert isinstance(admin.site, StintAdminSite)


def test_staff_admin_gets_in(client):
    client.force_login(UserFactory(admin=True))
    assert client.get("/admin/").status_code == 200


@pytest.mark.parametrize(
    "traits",
    [
        {"role": Role.USER, "is_staff": True},  # staff flag alone
        {"role": Role.USER, "is_staff": True, "is_superuser": True},  # even a superuser needs the role
        {"role": Role.ADMIN, "is_staff": False},  # an API admin who is not staff
        {"role": Role.ADMIN, "is_staff": True, "is_active": False},
    ],
)
def test_everyone_else_is_sent_to_the_login_page(client, traits):
    client.force_login(UserFactory(**traits))
    resp = client.get("/admin/")
    assert resp.status_code == 302
    assert resp["Location"].startswith("/admin/login/")


# -- the guards of hostile input hold on every admin of the site, Django's and third parties' too ---


@pytest.fixture
def operator(client):
    client.force_login(UserFactory(admin=True))
    return client


@pytest.mark.parametrize(
    "url",
    [
        "/admin/accounts/user/?date_joined__gte=2030-01-01T00:00:00%2B23:59",
        "/admin/token_blacklist/outstandingtoken/?created_at__gte=2030-01-01T00:00:00-16:00",
        "/admin/token_blacklist/outstandingtoken/?expires_at__lt=2030-01-01T00:00:00%2B16:00",
    ],
)
def test_a_time_filter_with_an_offset_postgresql_refuses_is_read_in_utc_on_every_admin(operator, url):
    assert operator.get(url).status_code == 200


@pytest.mark.parametrize(
    "url",
    [
        "/admin/token_blacklist/outstandingtoken/?created_at__year=-1",
        "/admin/token_blacklist/outstandingtoken/?expires_at__year=99999999999999999999",
        "/admin/accounts/user/?date_joined__year=0",
        "/admin/auth/group/?name__regex=[]",
        "/admin/accounts/user/?username__iregex=(",
    ],
)
def test_a_filter_value_that_cannot_be_queried_is_the_bad_filter_page_on_every_admin(operator, url):
    response = operator.get(url)

    assert response.status_code == 302
    assert response["Location"] == f"{url.split('?')[0]}?e=1"  # Django's answer to an invalid lookup


@pytest.mark.parametrize("bad", ["not-a-number", "1e309", "", "01a23b90-1d8c-77c7-ab4d-78ac9fbadb30"])
@pytest.mark.parametrize("changelist", ["/admin/accounts/user/", "/admin/auth/group/"])
def test_an_action_on_a_selected_id_that_is_not_one_is_refused_with_a_message_on_every_admin(operator, changelist, bad):
    from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
    from django.contrib.auth.models import Group
    from django.contrib.messages import get_messages

    kept = UserFactory() if "user" in changelist else Group.objects.create(name="g")

    response = operator.post(
        changelist, {"action": "delete_selected", ACTION_CHECKBOX_NAME: [str(kept.pk), bad], "index": 0}
    )

    assert response.status_code == 302
    assert "is not one" in " ".join(str(m) for m in get_messages(response.wsgi_request))
    assert type(kept).objects.filter(pk=kept.pk).exists()


@pytest.mark.parametrize(
    ("model", "object_id"),
    [("scheduler.job", "not-a-uuid"), ("scheduler.job", "1"), ("scheduler.queue", "a%00b"), ("accounts.user", "%00")],
)
def test_the_view_on_site_shortcut_answers_an_id_that_is_not_one_with_a_404(operator, model, object_id):
    from django.contrib.contenttypes.models import ContentType

    content_type = ContentType.objects.get_by_natural_key(*model.split("."))

    response = operator.get(f"/admin/r/{content_type.pk}/{object_id}/")

    assert response.status_code == 404


def test_every_registered_admin_carries_the_input_guards():
    from core.admin_input import GuardedModelAdmin

    unguarded = [type(a).__name__ for a in admin.site._registry.values() if not isinstance(a, GuardedModelAdmin)]
    assert not unguarded
