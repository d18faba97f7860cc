"""Migrations of the scheduler: 0005 (integer priorities), 0012 (the result in the job row), 0013 (attempt
constraint, outbox compression), 0014 (packed outbox events), 0016 (successful attempts kept in
the job row), 0023 (idempotency records of schedules); forward and back."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.utils import NotSupportedError

from scheduler.events import ENTRY_SQL
from scheduler.models import Job

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("scheduler", "0004_retention_indexes")
INTEGER = ("scheduler", "0005_integer_priority")
RESULT_TABLE = ("scheduler", "0011_job_fillfactor")
RESULT_IN_ROW = ("scheduler", "0012_job_result_in_row")
LZ4_OUTBOX = ("scheduler", "0013_attempt_fk_check_outbox_lz4")
PACKED_OUTBOX = ("scheduler", "0014_outbox_packed_events")
UUID7_IDS = ("scheduler", "0015_job_id_uuid7")
ATTEMPT_VIEW = ("scheduler", "0016_attempt_view")
DOCUMENT_STATISTICS = ("scheduler", "0022_no_statistics_for_documents")
SCHEDULE_KEYS = ("scheduler", "0023_idempotency_schedule")


def _migrate(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])


@contextlib.contextmanager
def _todays_columns() -> Iterator[None]:
    """Give an older schema the job column today's ``lifecycle`` code writes (0019's ``flow_held``), then drop it.

    The tests below run today's transitions against the schema of an older migration, as a
    process of a newer release would during a rolling upgrade of this range.
    """
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE stint_job ADD COLUMN flow_held boolean NOT NULL DEFAULT false")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE stint_job DROP COLUMN flow_held")


def _insert_job(priority: int, *, status: str = "QUEUED", attempts: int = 0) -> uuid.UUID:
    job_id = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO stint_job (id, name, type, payload, status, priority, queue, scheduled_at, attempts,
                                   attempts_base, max_retries, timeout_seconds, cancel_requested, event_sequence,
                                   created_at, updated_at, last_error)
            VALUES (%s, '', 'DEMO_TASK', '{}', %s, %s, 'default', now(), %s, 0, 3, 300, false, 0, now(), now(), '')
            """,
            [job_id, status, priority, attempts],
        )
    return job_id


def _insert_attempt(job_id: uuid.UUID, number: int, status: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO stint_job_attempt (job_id, attempt_number, status, worker, started_at, error, traceback)
            VALUES (%s, %s, %s, 'w', now(), '', '')
            """,
            [job_id, number, status],
        )


def _fetch(sql: str, params: list) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _priorities(ids: list[uuid.UUID]) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, priority FROM stint_job WHERE id = ANY(%s)", [ids])
        found = dict(cursor.fetchall())
    return [found[i] for i in ids]


def test_0005_maps_high_medium_low_to_50_0_minus_50_and_back() -> None:
    leaf = MigrationExecutor(connection).loader.graph.leaf_nodes("scheduler")
    try:
        _migrate(BEFORE)
        old = [_insert_job(p) for p in (0, 1, 2)]  # HIGH, MEDIUM, LOW in the old numbering

        _migrate(INTEGER)
        assert _priorities(old) == [50, 0, -50]
        between = [_insert_job(p) for p in (37, -5)]

        _migrate(BEFORE)
        assert _priorities(old + between) == [0, 1, 2, 0, 2]  # values between the names fall into bands
    finally:
        _migrate(leaf[0])


def test_0012_moves_results_into_their_job_rows_drops_claim_time_attempt_rows_and_goes_back() -> None:
    leaf = MigrationExecutor(connection).loader.graph.leaf_nodes("scheduler")
    try:
        _migrate(RESULT_TABLE)
        done, failed, waiting = (_insert_job(0, status=s, attempts=1) for s in ("SUCCESS", "FAILED", "QUEUED"))
        running = _insert_job(0, status="RUNNING", attempts=2)
        with connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO stint_job_result (job_id, attempt, status, result, created_at) VALUES
                    (%s, 1, 'SUCCEEDED', '{"echo": [1, 2]}', '2026-01-02T03:04:05Z'),
                    (%s, 1, 'FAILED', NULL, '2026-01-02T03:04:06Z')
                """,
                [done, failed],
            )
        _insert_attempt(running, 1, "FAILED")  # a finished attempt: history, kept
        _insert_attempt(running, 2, "RUNNING")  # written at claim by an older release: the job row says it
        _insert_attempt(done, 1, "RUNNING")  # a stale row of a job no longer running: kept as it was

        _migrate(RESULT_IN_ROW)
        rows = _fetch(
            "SELECT id, result_attempt, result_status, result::text, result_at::text FROM stint_job WHERE id = ANY(%s)",
            [[done, failed, waiting]],
        )
        assert {r[0]: r[1:] for r in rows} == {
            done: (1, "SUCCEEDED", '{"echo": [1, 2]}', "2026-01-02 03:04:05+00"),
            failed: (1, "FAILED", None, "2026-01-02 03:04:06+00"),
            waiting: (None, None, None, None),
        }
        attempts = "SELECT job_id, attempt_number, status FROM stint_job_attempt WHERE job_id = ANY(%s) ORDER BY 1, 2"
        assert set(_fetch(attempts, [[running, done]])) == {(running, 1, "FAILED"), (done, 1, "RUNNING")}

        _migrate(RESULT_TABLE)
        back = _fetch("SELECT job_id, attempt, status, result::text FROM stint_job_result ORDER BY status", [])
        assert back == [(failed, 1, "FAILED", None), (done, 1, "SUCCEEDED", '{"echo": [1, 2]}')]
    finally:
        _migrate(leaf[0])


def _server_has_lz4() -> bool:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("CREATE TEMP TABLE lz4_probe (v text COMPRESSION lz4) ON COMMIT DROP")
    except NotSupportedError:  # "compression method lz4 not supported"
        return False
    return True


def _events_compression() -> str:
    """pg_attribute.attcompression of stint_outbox.events: 'l' lz4, 'p' pglz, '' the server default (pglz)."""
    return _fetch(
        "SELECT attcompression FROM pg_attribute WHERE attrelid = 'stint_outbox'::regclass AND attname = 'events'", []
    )[0][0]


def _attempt_constraints() -> list[tuple]:
    return _fetch(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'stint_job_attempt'::regclass AND contype = 'f'", []
    )


def test_0013_drops_the_attempt_check_and_compresses_outbox_events_with_lz4_where_the_server_can() -> None:
    leaf = MigrationExecutor(connection).loader.graph.leaf_nodes("scheduler")
    try:
        _migrate(RESULT_IN_ROW)
        assert _events_compression() == ""
        assert len(_attempt_constraints()) == 1

        _migrate(LZ4_OUTBOX)  # on a server without lz4 (the dev stack's) it notes so and goes on
        assert _events_compression() == ("l" if _server_has_lz4() else "")
        assert _attempt_constraints() == []

        _migrate(RESULT_IN_ROW)
        assert _events_compression() == ""
        assert len(_attempt_constraints()) == 1
    finally:
        _migrate(leaf[0])


def test_deleting_a_job_through_django_still_deletes_its_attempts() -> None:
    job_id = _insert_job(0, status="FAILED", attempts=2)
    _insert_attempt(job_id, 1, "FAILED")
    _insert_attempt(job_id, 2, "FAILED")
    Job.objects.filter(id=job_id).delete()
    assert _fetch("SELECT count(*) FROM stint_job_attempt WHERE job_id = %s", [job_id]) == [(0,)]


def _insert_json_row(job_id: uuid.UUID, event_id: uuid.UUID) -> int:
    """An outbox row in the JSON form (as every row was before 0014): one JOB_CREATED event."""
    event = {
        "event_id": str(event_id),
        "event_type": "JOB_CREATED",
        "job_id": str(job_id),
        "owner_id": None,
        "sequence": 1,
        "attempt": 0,
        "from_status": "",
        "to_status": "CREATED",
        "payload": {"type": "DEMO_TASK", "queue": "default", "priority": "MEDIUM"},
    }
    return _fetch(
        "INSERT INTO stint_outbox (schema_version, occurred_at, event_count, events)"
        " VALUES (1, now(), 1, jsonb_build_array(%s::jsonb)) RETURNING id",
        [json.dumps(event)],
    )[0][0]


def _rendered(outbox_id: int) -> list[dict]:
    """A row's events as the relay reads them (through ``stint_outbox_entries`` where it exists)."""
    function = _fetch("SELECT count(*) FROM pg_proc WHERE proname = 'stint_outbox_entries'", [])[0][0]
    entries, entry = (
        ("stint_outbox_entries(o.events, o.packed_events) AS e", ENTRY_SQL)
        if function
        else ("jsonb_array_elements(o.events) WITH ORDINALITY AS e(ev, position)", "e.ev")
    )
    rows = _fetch(
        f"SELECT {entry} FROM stint_outbox o CROSS JOIN LATERAL {entries} WHERE o.id = %s ORDER BY e.position",  # noqa: S608
        [outbox_id],
    )
    return [json.loads(ev) if isinstance(ev, str) else ev for (ev,) in rows]


def test_0014_keeps_json_rows_writes_packed_ones_and_unpacks_them_going_back() -> None:
    from scheduler import lifecycle
    from scheduler.states import JobStatus

    leaf = MigrationExecutor(connection).loader.graph.leaf_nodes("scheduler")
    try:
        _migrate(LZ4_OUTBOX)
        job_id, event_id = _insert_job(0), uuid.uuid4()
        json_row = _insert_json_row(job_id, event_id)
        before = _rendered(json_row)

        _migrate(PACKED_OUTBOX)
        assert _rendered(json_row) == before  # an old row reads as it did, its random event id kept
        with _todays_columns(), transaction.atomic():
            lifecycle._transition(job_ids=[job_id], to=JobStatus.CANCELLED)
        (packed_row,) = _fetch("SELECT id FROM stint_outbox WHERE packed_events IS NOT NULL", [])[0]
        packed = _rendered(packed_row)
        assert [(e["event_type"], e["sequence"], e["to_status"]) for e in packed] == [("JOB_CANCELLED", 1, "CANCELLED")]
        assert packed[0]["payload"] == {"type": "DEMO_TASK", "queue": "default", "priority": "MEDIUM"}

        _migrate(LZ4_OUTBOX)  # packed rows become JSON rows holding the very entries they rendered
        assert _rendered(packed_row) == packed
        assert _rendered(json_row) == before
        assert _fetch("SELECT count(*) FROM stint_outbox WHERE events IS NULL", []) == [(0,)]
    finally:
        _migrate(leaf[0])


def _attempts(job_id: uuid.UUID) -> list[tuple]:
    return _fetch(
        "SELECT attempt_number, status, worker, lease_token IS NOT NULL, id ~ '^[0-9]+$' FROM stint_attempt"
        " WHERE job_id = %s ORDER BY attempt_number",
        [job_id],
    )


def test_0016_shows_old_rows_and_job_kept_successes_once_and_writes_the_rows_going_back() -> None:
    from scheduler import lifecycle
    from scheduler.states import AttemptStatus

    leaf = MigrationExecutor(connection).loader.graph.leaf_nodes("scheduler")
    try:
        _migrate(UUID7_IDS)
        old = _insert_job(0, status="SUCCESS", attempts=1)  # finished before 0016: its row stays the record
        _insert_attempt(old, 1, "SUCCEEDED")
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE stint_job SET result_attempt = 1, result_status = 'SUCCEEDED', result_at = now(),"
                " finished_at = now(), started_at = now() WHERE id = %s",
                [old],
            )

        _migrate(ATTEMPT_VIEW)
        assert _attempts(old) == [(1, "SUCCEEDED", "w", False, True)]  # shown once, from its row
        new = _insert_job(0, attempts=1)
        _insert_attempt(new, 1, "LOST")  # a first attempt lost, then a successful second one
        with _todays_columns(), transaction.atomic():
            (claimed,) = lifecycle.claim(worker_id="w2", limit=1, lease_seconds=30, queues=None)
            lifecycle.complete(
                [
                    lifecycle.AttemptEnd(
                        job_id=claimed.id, lease_token=claimed.lease_token, status=AttemptStatus.SUCCEEDED
                    )
                ]
            )
        assert _fetch("SELECT count(*) FROM stint_job_attempt WHERE job_id = %s", [new]) == [(1,)]
        assert _attempts(new) == [(1, "LOST", "w", False, True), (2, "SUCCEEDED", "w2", True, False)]

        _migrate(UUID7_IDS)  # the made-up row is written, and the job's lease cleared as 0015's code left it
        assert _fetch(
            "SELECT attempt_number, status, worker, lease_token = %s FROM stint_job_attempt"
            " WHERE job_id = %s ORDER BY attempt_number",
            [claimed.lease_token, new],
        ) == [(1, "LOST", "w", None), (2, "SUCCEEDED", "w2", True)]
        assert _fetch("SELECT lease_owner, lease_token FROM stint_job WHERE id = %s", [new]) == [(None, None)]
        assert _fetch("SELECT count(*) FROM stint_job_attempt WHERE job_id = %s", [old]) == [(1,)]
    finally:
        _migrate(leaf[0])


def _idempotency_columns() -> set[str]:
    return {c.name for c in connection.introspection.get_table_description(connection.cursor(), "stint_idempotency")}


def test_0023_adds_the_schedule_of_a_key_with_a_validated_check_and_goes_back() -> None:
    from accounts.models import User

    leaf = MigrationExecutor(connection).loader.graph.leaf_nodes("scheduler")
    owner = User.objects.create(username="keys")
    job = _insert_job(0)
    record = (
        "INSERT INTO stint_idempotency (owner_id, key, fingerprint, job_id, created_at, expires_at)"
        " VALUES (%s, %s, 'f', %s, now(), now() + interval '1 day')"
    )
    try:
        _migrate(DOCUMENT_STATISTICS)
        assert "schedule_id" not in _idempotency_columns()
        with connection.cursor() as cursor:
            cursor.execute(record, [owner.pk, "before", job])

        _migrate(SCHEDULE_KEYS)
        assert "schedule_id" in _idempotency_columns()
        assert _fetch("SELECT convalidated FROM pg_constraint WHERE conname = 'idempotency_one_target'", []) == [
            (True,)
        ]
        assert _fetch("SELECT key, job_id, schedule_id FROM stint_idempotency", []) == [("before", job, None)]
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("UPDATE stint_idempotency SET schedule_id = 1 WHERE key = 'before'")  # a job and a schedule

        _migrate(DOCUMENT_STATISTICS)
        assert "schedule_id" not in _idempotency_columns()
        assert not _fetch("SELECT 1 FROM pg_constraint WHERE conname = 'idempotency_one_target'", [])
        assert _fetch("SELECT key, job_id FROM stint_idempotency", []) == [("before", job)]
    finally:
        _migrate(leaf[0])
