"""The waiting board (scheduler.workers.waiting_board): the jobs a worker holds unbegun, read after it died."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import uuid

from scheduler.workers.waiting_board import ID_BYTES, WaitingBoard, capacity_for, read_waiting


def test_a_full_board_lists_no_more_jobs_and_a_cleared_entry_serves_again() -> None:
    array = bytearray(ID_BYTES * 2)
    board = WaitingBoard(array)
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    first = board.put(a)
    assert board.put(b) is not None
    assert board.put(c) is None  # every entry taken: c is not listed (it counts as begun)
    assert read_waiting(array) == {a, b}
    board.clear(first)
    board.clear(None)  # a job that was never listed
    assert board.put(c) == first
    assert read_waiting(array) == {b, c}


def test_an_entry_a_kill_left_half_written_or_half_cleared_lists_no_job_it_held() -> None:
    array = bytearray(ID_BYTES * capacity_for(1))
    board = WaitingBoard(array)
    job = uuid.uuid4()
    index = board.put(job)
    array[index * ID_BYTES : index * ID_BYTES + 8] = bytes(8)  # killed halfway through clearing it
    assert job not in read_waiting(array)
    other = uuid.uuid4()
    index = board.put(other)
    array[index * ID_BYTES + 8 : (index + 1) * ID_BYTES] = bytes(8)  # killed halfway through writing it
    assert other not in read_waiting(array)


def _list_two_begin_one_and_die(array: object, first: bytes, second: bytes) -> None:
    board = WaitingBoard(array)
    board.put(uuid.UUID(bytes=first))
    board.clear(board.put(uuid.UUID(bytes=second)))  # a slot began it
    os.kill(os.getpid(), signal.SIGKILL)


def test_the_parent_reads_what_a_process_killed_with_sigkill_left_listed() -> None:
    ctx = multiprocessing.get_context("spawn")
    array = ctx.RawArray(ctypes.c_char, ID_BYTES * capacity_for(2))
    waiting, begun = uuid.uuid4(), uuid.uuid4()
    child = ctx.Process(target=_list_two_begin_one_and_die, args=(array, waiting.bytes, begun.bytes))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert read_waiting(array) == {waiting}
