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
