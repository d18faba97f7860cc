"""The pool's per-job cancel flag (``CancelEvent``): an Event's behaviour, its Event made only when waited on."""

from __future__ import annotations

import threading
import time

import pytest

from scheduler.registry import JobContext
from scheduler.workers.pool import CancelEvent


def test_a_new_flag_is_clear_and_a_wait_times_out_false():
    flag = CancelEvent()
    started = time.monotonic()

    assert flag.is_set() is False
    assert flag.wait(0.05) is False
    assert time.monotonic() - started >= 0.05


def test_a_set_flag_stays_set_and_a_wait_returns_true_at_once():
    flag = CancelEvent()
    flag.set()
    flag.set()  # idempotent

    assert flag.is_set() is True
    assert flag.wait(10) is True
    assert flag._event is None  # nobody had to block, so no Event was made


def test_set_from_another_thread_wakes_a_waiter():
    flag = CancelEvent()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(flag.wait(30)))
    waiter.start()
    while flag._event is None:  # the waiter is blocked on the lazily made Event
        time.sleep(0.001)

    flag.set()
    waiter.join(5)

    assert woke == [True]


def test_a_handlers_sleep_ends_with_jobcancelled_when_the_flag_is_set():
    from scheduler.exceptions import JobCancelled

    flag = CancelEvent()
    ctx = JobContext(job_id=None, attempt=1, owner_id=None, logger=None, cancel_flag=flag)
    threading.Timer(0.05, flag.set).start()
    started = time.monotonic()

    with pytest.raises(JobCancelled):
        ctx.sleep(30)
    assert time.monotonic() - started < 5
