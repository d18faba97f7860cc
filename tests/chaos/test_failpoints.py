"""A failpoint fires in exactly one process per arming."""

from __future__ import annotations

from chaos.failpoints import HOOKS, claim


def test_an_armed_failpoint_is_claimed_once(tmp_path):
    (tmp_path / "relay-after-produce").touch()
    assert claim(tmp_path, "relay-after-produce") is True
    assert claim(tmp_path, "relay-after-produce") is False
    assert len(list(tmp_path.glob("relay-after-produce.taken.*"))) == 1


def test_an_unarmed_failpoint_does_not_fire(tmp_path):
    assert claim(tmp_path, "audit-before-commit") is False


def test_every_hooked_method_exists_in_the_code_it_wraps():
    import importlib

    for module, cls, method, _ in HOOKS.values():
        assert callable(getattr(getattr(importlib.import_module(module), cls), method))
