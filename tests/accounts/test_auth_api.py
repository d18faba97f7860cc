"""The JWT auth endpoints and the 401 contract for bad tokens."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from datetime import timedelta

import jwt
import pytest
from django.conf import settings
from django.core.management import call_command
from rest_framework_simplejwt.tokens import AccessToken, RefreshToken

from accounts.models import Role, User
from tests.support.factories import PASSWORD

pytestmark = pytest.mark.django_db


def _login(api, username: str, password: str = PASSWORD):
    return api.post("/api/auth/login", {"username": username, "password": password}, format="json")


def test_register_creates_a_user_never_an_admin(api, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.Argon2PasswordHasher"]
    resp = api.post("/api/auth/register", {"username": "mallory", "password": PASSWORD}, format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["role"] == "USER"
    user = User.objects.get(username="mallory")
    assert (user.role, user.is_staff, user.is_superuser) == (Role.USER, False, False)
    assert user.password.startswith("argon2")


@pytest.mark.parametrize(
    ("field", "value"), [("role", "ADMIN"), ("role", "USER"), ("is_staff", True), ("is_superuser", True)]
)
def test_register_refuses_a_role_or_staff_flag_in_the_body(api, field, value):
    resp = api.post("/api/auth/register", {"username": "mallory", "password": PASSWORD, field: value}, format="json")
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["code"] == "validation_error"
    assert error["message"] == f"{field}: cannot be chosen at registration; an admin grants roles."
    assert error["details"] == {field: ["cannot be chosen at registration; an admin grants roles."]}
    assert not User.objects.filter(username="mallory").exists()


def test_register_rejects_weak_password_and_duplicate_username(api, user):
    weak = api.post("/api/auth/register", {"username": "weakling", "password": "123"}, format="json")
    assert weak.status_code == 400
    assert weak.json()["error"]["code"] == "validation_error"
    assert "password" in weak.json()["error"]["details"]
    dup = api.post("/api/auth/register", {"username": user.username.upper(), "password": PASSWORD}, format="json")
    assert dup.status_code == 400
    assert "username" in dup.json()["error"]["details"]


def test_register_rejects_unknown_fields(api):
    resp = api.post("/api/auth/register", {"username": "carol", "password": PASSWORD, "x": 1}, format="json")
    assert resp.status_code == 400
    assert "x" in resp.json()["error"]["details"]


def test_createsuperuser_makes_an_admin(monkeypatch):
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", PASSWORD)
    call_command("createsuperuser", "--noinput", "--username", "root", "--email", "root@example.test")
    assert User.objects.get(username="root").role == Role.ADMIN


def test_login_me_refresh_logout_cycle(api, user):
    tokens = _login(api, user.username).json()
    assert set(tokens) == {"access", "refresh"}

    api.credentials(HTTP_AUTHORIZATION=f"Bearer {tokens['access']}")
    me = api.get("/api/auth/me")
    assert me.status_code == 200
    assert me.json()["username"] == user.username

    rotated = api.post("/api/auth/refresh", {"refresh": tokens["refresh"]}, format="json")
    assert rotated.status_code == 200
    new = rotated.json()
    assert new["refresh"] != tokens["refresh"]
    # Rotation blacklists the old refresh token.
    reused = api.post("/api/auth/refresh", {"refresh": tokens["refresh"]}, format="json")
    assert reused.status_code == 401
    assert reused.json()["error"]["code"] == "token_not_valid"

    out = api.post("/api/auth/logout", {"refresh": new["refresh"]}, format="json")
    assert out.status_code == 205
    refused = api.post("/api/auth/refresh", {"refresh": new["refresh"]}, format="json")
    assert refused.status_code == 401


def test_logout_refuses_someone_elses_refresh_token(api, user, other_user):
    theirs = _login(api, other_user.username).json()["refresh"]
    mine = _login(api, user.username).json()["access"]
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {mine}")
    resp = api.post("/api/auth/logout", {"refresh": theirs}, format="json")
    assert resp.status_code == 400
    assert api.post("/api/auth/refresh", {"refresh": theirs}, format="json").status_code == 200


def test_login_with_wrong_password_is_401(api, user):
    resp = _login(api, user.username, "wrong-password-123")
    assert resp.status_code == 401
    assert resp.json()["error"]["message"]


def _b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _claims(user) -> dict:
    return dict(AccessToken.for_user(user).payload)


@pytest.mark.parametrize(
    "make_header",
    [
        pytest.param(lambda u: None, id="missing"),
        pytest.param(lambda u: "Bearer", id="empty-bearer"),
        pytest.param(lambda u: "Bearer not.a.jwt", id="malformed"),
        pytest.param(lambda u: "Basic dXNlcjpwYXNz", id="wrong-scheme"),
        pytest.param(
            lambda u: "Bearer " + jwt.encode({**_claims(u), "exp": 1}, settings.SIMPLE_JWT["SIGNING_KEY"], "HS256"),
            id="expired",
        ),
        pytest.param(
            lambda u: "Bearer " + jwt.encode(_claims(u), "another-key-of-at-least-32-bytes!!", "HS256"),
            id="wrong-key",
        ),
        pytest.param(
            lambda u: "Bearer " + _b64({"alg": "none", "typ": "JWT"}) + "." + _b64(_claims(u)) + ".",
            id="alg-none",
        ),
        pytest.param(
            lambda u: "Bearer " + str(AccessToken.for_user(u))[:-4] + "AAAA",
            id="tampered-signature",
        ),
        pytest.param(
            lambda u: (
                "Bearer "
                + (lambda t: t[0] + "." + _b64({**_claims(u), "user_id": str(u.pk + 1)}) + "." + t[2])(
                    str(AccessToken.for_user(u)).split(".")
                )
            ),
            id="tampered-payload",
        ),
    ],
)
def test_bad_tokens_get_401_in_the_error_shape(api, user, make_header):
    header = make_header(user)
    if header is not None:
        api.credentials(HTTP_AUTHORIZATION=header)
    resp = api.get("/api/auth/me")
    assert resp.status_code == 401, resp.content
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] in {
        "not_authenticated",
        "authentication_failed",
        "token_not_valid",
        "bad_authorization_header",
    }


def test_refresh_token_is_not_accepted_as_access(api, user):
    refresh = _login(api, user.username).json()["refresh"]
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {refresh}")
    assert api.get("/api/auth/me").status_code == 401


def test_an_expired_access_token_is_a_401_whose_message_says_token_expired(api, user):
    token = AccessToken.for_user(user)
    token.set_exp(lifetime=-timedelta(seconds=1))
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    resp = api.get("/api/auth/me")

    assert resp.status_code == 401
    error = resp.json()["error"]
    assert error["code"] == "token_not_valid"  # the code and shape are unchanged
    assert error["message"].startswith("Token expired:") and "POST /api/auth/refresh" in error["message"]
    assert error["details"]["messages"][0]["message"] == "Token is expired"
    # A token that is merely bad does not claim to have expired.
    api.credentials(HTTP_AUTHORIZATION="Bearer not.a.jwt")
    assert "expired" not in api.get("/api/auth/me").json()["error"]["message"].lower()


def test_an_expired_refresh_token_says_token_expired_and_to_sign_in_again(api, user):
    refresh = RefreshToken.for_user(user)
    refresh.set_exp(lifetime=-timedelta(seconds=1))

    resp = _refresh(api, str(refresh))

    assert resp.status_code == 401
    assert resp.json()["error"]["message"].startswith("Token expired:")
    assert "sign in again" in resp.json()["error"]["message"]


@pytest.mark.parametrize("how", ["deleted", "deactivated"])
def test_the_refresh_token_of_a_deleted_or_deactivated_account_is_a_401_not_a_500(api, user, how):
    refresh = _login(api, user.username).json()["refresh"]
    if how == "deleted":  # an operator deletes the account in the console; its tokens outlive it
        user.delete()
    else:
        User.objects.filter(pk=user.pk).update(is_active=False)

    resp = api.post("/api/auth/refresh", {"refresh": refresh}, format="json")

    assert resp.status_code == 401, resp.content
    assert resp.json()["error"]["code"] == "no_active_account"


NEW_PASSWORD = "a-brand-new-Passphrase-7"


def _refresh(api, token: str):
    return api.post("/api/auth/refresh", {"refresh": token}, format="json")


@pytest.mark.parametrize("how", ["admin_user_form", "own_admin_password_change", "changepassword_command"])
def test_a_password_change_revokes_every_outstanding_refresh_token(api, client, user, admin_user, how, monkeypatch):
    first = _login(api, user.username).json()["refresh"]
    rotated = _refresh(api, _login(api, user.username).json()["refresh"]).json()["refresh"]
    other = _login(api, admin_user.username).json()["refresh"]  # someone else's: untouched, unless it is theirs

    if how == "admin_user_form":  # an operator sets the user's password in the console
        client.force_login(admin_user)
        form = {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "usable_password": "true"}
        assert client.post(f"/admin/accounts/user/{user.pk}/password/", form).status_code == 302
    elif how == "own_admin_password_change":  # the user changes their own, knowing the old one
        user.is_staff = True
        user.role = Role.ADMIN
        user.save()
        client.force_login(user)
        form = {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD}
        assert client.post("/admin/password_change/", form).status_code == 302
    else:
        answers = iter([NEW_PASSWORD, NEW_PASSWORD])
        monkeypatch.setattr("getpass.getpass", lambda *a, **k: next(answers))
        call_command("changepassword", user.username, stdout=io.StringIO())

    for token in (first, rotated):
        refused = _refresh(api, token)
        assert refused.status_code == 401, refused.content
        assert refused.json()["error"]["code"] == "token_not_valid"
    assert _refresh(api, other).status_code == 200
    fresh = _login(api, user.username, NEW_PASSWORD).json()["refresh"]
    assert _refresh(api, fresh).status_code == 200


@pytest.mark.django_db(transaction=True)  # two connections: a registration in flight and the request
def test_racing_registrations_of_alice_and_Alice_give_one_201_and_one_400(api):
    from django.db import connection, transaction

    from accounts.services import user_register

    inserted, release, outcome = threading.Event(), threading.Event(), {}

    def first_registration() -> None:
        # "Alice" is inserted but not committed: the API's case-insensitive check cannot see it yet.
        try:
            with transaction.atomic():
                user_register(username="Alice", password=PASSWORD)
                inserted.set()
                release.wait(timeout=10)
            outcome["first"] = "committed"
        finally:
            connection.close()

    racer = threading.Thread(target=first_registration)
    racer.start()
    assert inserted.wait(timeout=10)

    def release_once_blocked() -> None:
        # Commit "Alice" once the request's INSERT of "alice" waits on the unique index.
        try:
            with connection.cursor() as cursor:
                for _ in range(500):
                    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
                    if cursor.fetchone()[0]:
                        break
                    time.sleep(0.01)
        finally:
            release.set()
            connection.close()

    releaser = threading.Thread(target=release_once_blocked)
    releaser.start()
    second = api.post("/api/auth/register", {"username": "alice", "password": PASSWORD}, format="json")
    racer.join(timeout=10)
    releaser.join(timeout=10)

    assert outcome == {"first": "committed"}
    assert second.status_code == 400, second.content
    assert second.json()["error"]["details"] == {"username": ["A user with that username already exists."]}
    assert list(User.objects.values_list("username", flat=True)) == ["Alice"]
    later = api.post("/api/auth/register", {"username": "ALICE", "password": PASSWORD}, format="json")
    assert later.status_code == 400


@pytest.mark.parametrize(
    ("header", "scheme"),
    [
        ("Token abc123", "Token"),
        ("Basic dXNlcjpwYXNz", "Basic"),
        ("JWT abc.def.ghi", "JWT"),
        ("abc.def.ghi", "abc.def.ghi"),
    ],
)
def test_a_header_with_another_scheme_is_a_401_that_says_bearer_jwt_is_expected(api, user, header, scheme):
    # SimpleJWT ignores a header whose scheme is not Bearer, so DRF said "credentials were not provided".
    api.credentials(HTTP_AUTHORIZATION=header)
    resp = api.get("/api/auth/me")
    assert resp.status_code == 401
    assert resp["WWW-Authenticate"].startswith("Bearer")
    error = resp.json()["error"]
    assert error["code"] == "bad_authorization_header"
    assert "Authorization: Bearer <access token>" in error["message"]
    assert f"not {scheme!r}" in error["message"]
    assert "POST /api/auth/login" in error["message"]


def test_no_credentials_at_all_says_how_to_send_them(api):
    error = api.get("/api/auth/me").json()["error"]
    assert error["code"] == "not_authenticated"
    assert "Authorization: Bearer <access token>" in error["message"]


@pytest.mark.parametrize("header", ["Bearer", "Bearer  ", "Bearer abc def"])
def test_a_bearer_header_without_exactly_one_token_says_how_to_send_it(api, user, header):
    # SimpleJWT's own message, "Authorization header must contain two space-delimited values", said
    # what was wrong but not what to send.
    api.credentials(HTTP_AUTHORIZATION=header)
    resp = api.get("/api/auth/me")
    assert resp.status_code == 401
    error = resp.json()["error"]
    assert error["code"] == "bad_authorization_header"
    assert "two space-delimited values" in error["message"]
    assert "Authorization: Bearer <access token>" in error["message"]
    assert "POST /api/auth/login" in error["message"]


@pytest.mark.parametrize(("value", "kind"), [(12345, "a number"), (True, "a boolean"), (["12345"], "an array")])
def test_login_and_refresh_given_a_number_where_a_string_goes_is_a_400_that_says_so(api, value, kind):
    # simplejwt's CharField read 12345 as "12345" and signed the user "12345" in, while register
    # refuses that body: the same rule holds for every text field of the API.
    from tests.support.factories import UserFactory

    UserFactory(username="12345")

    login = api.post("/api/auth/login", {"username": value, "password": PASSWORD}, format="json")
    refresh = api.post("/api/auth/refresh", {"refresh": value}, format="json")

    for response, field in ((login, "username"), (refresh, "refresh")):
        assert response.status_code == 400, response.content
        assert response.json()["error"]["details"][field] == [f"A string is expected, not {kind}."]
