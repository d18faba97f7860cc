"""The cron firer: due schedules become jobs once, fenced by the leader's token; misfire and overlap policies.

Driven through ``run_once(now)`` with explicit instants; nothing waits on timers. ``leader.leading_since``
is set by hand where a test needs a leader that has been leading since a given instant.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db import connections
from django_redis import get_redis_connection
from prometheus_client import REGISTRY

from scheduler import metrics, schedules
from scheduler.job_actions import job_cancel
from scheduler.leadership import Leadership, lock_key
from scheduler.maintenance import leader_services
from scheduler.maintenance.cron_firer import CronFirer
from scheduler.models import CronSchedule, Job, LeaderFence, OutboxEvent
from scheduler.states import EventType, JobStatus
from tests.support.jobs import db_now
from tests.support.leadership import an_hour_ago_on_the_minute
from tests.support.redis_server import RedisServer

UTC = dt.UTC
MINUTE = dt.timedelta(minutes=1)


def leading_since(lead: Leadership, since: dt.datetime) -> Leadership:
    lead.leading_since = since
    return lead


def schedule(user, **fields) -> CronSchedule:
    fields.setdefault("name", "nightly")
    fields.setdefault("job", {"type": "DEMO_TASK", "payload": {"result": "hi"}})
    if "cron" not in fields and "interval_seconds" not in fields:
        fields["cron"] = "* * * * *"
    return schedules.schedule_create(owner=user, **fields)


def due_at(s: CronSchedule, t: dt.datetime) -> CronSchedule:
    CronSchedule.objects.filter(id=s.id).update(next_fire_at=t)
    s.refresh_from_db()
    return s


def fire_times_of(s: CronSchedule) -> list[dt.datetime]:
    return list(Job.objects.filter(schedule_id=s.id).order_by("fire_time").values_list("fire_time", flat=True))


def created_total(priority: str) -> float:
    labels = {"type": "DEMO_TASK", "queue": "default", "priority": priority}
    return REGISTRY.get_sample_value("jobs_created_total", labels) or 0.0


@pytest.mark.django_db
def test_due_schedules_become_jobs_once_and_advance(user, leader, django_capture_on_commit_callbacks):
    t0 = an_hour_ago_on_the_minute()
    leading_since(leader, t0 - dt.timedelta(hours=1))
    every_5 = due_at(schedule(user, cron="*/5 * * * *"), t0)
    every_90s = due_at(schedule(user, interval_seconds=90, job={"type": "DEMO_TASK", "priority": "HIGH"}), t0)
    later_one = due_at(schedule(user), t0 + dt.timedelta(minutes=10))
    firer = CronFirer(leadership=leader)
    counted = metrics.cron_fires_total._value.get()
    created_before = (created_total("MEDIUM"), created_total("HIGH"))

    with django_capture_on_commit_callbacks(execute=True):
        assert firer.run_once(now=t0 + dt.timedelta(seconds=1)) == 2
    assert metrics.cron_fires_total._value.get() == counted + 2
    # Cron's jobs count in jobs_created_total too (by type, queue, priority), once committed.
    assert (created_total("MEDIUM"), created_total("HIGH")) == (created_before[0] + 1, created_before[1] + 1)

    job = Job.objects.get(schedule_id=every_5.id)
    assert (job.fire_time, job.scheduled_at, job.status) == (t0, t0, JobStatus.QUEUED)
    assert (job.owner_id, job.type, job.payload, job.name) == (user.id, "DEMO_TASK", {"result": "hi"}, "nightly")
    assert Job.objects.get(schedule_id=every_90s.id).priority_name == "HIGH"
    events = OutboxEvent.objects.filter(job_id=job.id).order_by("sequence")
    assert list(events.values_list("event_type", flat=True)) == [EventType.JOB_CREATED, EventType.JOB_QUEUED]
    every_5.refresh_from_db()
    every_90s.refresh_from_db()
    assert (every_5.next_fire_at, every_5.last_fired_at) == (t0 + 5 * MINUTE, t0)
    assert (every_90s.next_fire_at, every_90s.last_fired_at) == (t0 + dt.timedelta(seconds=90), t0)
    assert not Job.objects.filter(schedule_id=later_one.id).exists()
    assert LeaderFence.objects.get(role=leader.role).token == leader.token

    assert firer.run_once(now=t0 + dt.timedelta(seconds=2)) == 0  # nothing due any more
    assert firer.run_once(now=t0 + dt.timedelta(minutes=5)) == 3
    assert fire_times_of(every_5) == [t0, t0 + 5 * MINUTE]
    # 90 s and 180 s are over a minute late (missed: "skip" keeps the latest), 270 s is on time.
    assert fire_times_of(every_90s) == [t0 + dt.timedelta(seconds=s) for s in (0, 180, 270)]


@pytest.mark.django_db
def test_without_leadership_nothing_fires(user, leaders):
    t0 = an_hour_ago_on_the_minute()
    due_at(schedule(user), t0)
    follower = leaders()
    assert CronFirer(leadership=follower).run_once(now=t0 + MINUTE) == 0
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_leader_services_builds_the_firer_for_run_scheduler(leader):
    (firer,) = leader_services(leader)
    assert isinstance(firer, CronFirer)
    assert (firer.name, firer.leader_only, firer.leadership) == ("cron_firer", True, leader)


@pytest.mark.django_db
def test_batches_cover_every_due_schedule_in_one_run(user, leader):
    t0 = an_hour_ago_on_the_minute()
    leading_since(leader, t0 - dt.timedelta(hours=1))
    made = [due_at(schedule(user, name=f"s{i}"), t0) for i in range(7)]
    assert CronFirer(leadership=leader, batch_size=3).run_once(now=t0 + dt.timedelta(seconds=5)) == 7
    assert Job.objects.filter(schedule_id__in=[s.id for s in made], fire_time=t0).count() == 7


@pytest.mark.django_db
def test_a_fire_that_already_exists_is_not_duplicated(user, leader):
    t0 = an_hour_ago_on_the_minute()
    leading_since(leader, t0 - dt.timedelta(hours=1))
    s = due_at(schedule(user), t0)
    existing = schedules.schedule_trigger(schedule_id=s.id)
    Job.objects.filter(id=existing.id).update(fire_time=t0)
    assert CronFirer(leadership=leader).run_once(now=t0 + dt.timedelta(seconds=5)) == 0
    assert fire_times_of(s) == [t0]
    s.refresh_from_db()
    assert s.next_fire_at == t0 + MINUTE


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("policy", "expected_minutes"),
    [
        ("skip", [9, 10]),  # one fire for the latest missed time (t0 + 9 min), then the on-time one
        ("catch_up", list(range(11))),  # every missed time (under the bound of 100)
        ("none", [10]),  # nothing missed
    ],
)
def test_misfire_policies_after_downtime(user, leader, policy, expected_minutes):
    # Nobody led from t0 until t0 + 9:30; this leader has led since then; it is now t0 + 10:20.
    t0 = an_hour_ago_on_the_minute()
    leading_since(leader, t0 + dt.timedelta(minutes=9, seconds=30))
    s = due_at(schedule(user, misfire_policy=policy), t0)
    CronFirer(leadership=leader).run_once(now=t0 + dt.timedelta(minutes=10, seconds=20))
    assert fire_times_of(s) == [t0 + m * MINUTE for m in expected_minutes]
    s.refresh_from_db()
    assert s.next_fire_at == t0 + 11 * MINUTE
    assert s.last_fired_at == t0 + 10 * MINUTE


@pytest.mark.django_db
def test_a_continuous_leader_counts_fires_older_than_the_grace_as_missed(user, leader):
    # Leading all along, but the firer did not run for 10 minutes (say the database was down).
    t0 = an_hour_ago_on_the_minute()
    leading_since(leader, t0 - dt.timedelta(hours=1))
    s = due_at(schedule(user, misfire_policy="skip"), t0)
    CronFirer(leadership=leader, misfire_grace_seconds=60).run_once(now=t0 + dt.timedelta(minutes=10, seconds=5))
    assert fire_times_of(s) == [t0 + 9 * MINUTE, t0 + 10 * MINUTE]


@pytest.mark.django_db
def test_catch_up_is_bounded(user, leader):
    t0 = an_hour_ago_on_the_minute()
    leading_since(leader, t0 + dt.timedelta(minutes=50))
    s = due_at(schedule(user, misfire_policy="catch_up"), t0)
    CronFirer(leadership=leader, catch_up_limit=5).run_once(now=t0 + dt.timedelta(minutes=50, seconds=5))
    assert fire_times_of(s) == [t0 + m * MINUTE for m in (45, 46, 47, 48, 49, 50)]


@pytest.mark.django_db
def test_overlap_skip_fires_nothing_while_the_previous_job_is_unfinished(user, leader):
    t0 = an_hour_ago_on_the_minute()
    leading_since(leader, t0 - dt.timedelta(hours=1))
    s = due_at(schedule(user, overlap_policy="skip", misfire_policy="catch_up"), t0)
    firer = CronFirer(leadership=leader)
    assert firer.run_once(now=t0 + dt.timedelta(seconds=1)) == 1
    assert firer.run_once(now=t0 + MINUTE + dt.timedelta(seconds=1)) == 0  # t0's job is still QUEUED
    s.refresh_from_db()
    assert s.next_fire_at == t0 + 2 * MINUTE  # the skipped fire is gone, not deferred
    job_cancel(job_id=Job.objects.get(schedule_id=s.id).id)  # finished (CANCELLED)
    # Three fire times are due now; overlap "skip" fires only the first of them.
    assert firer.run_once(now=t0 + 4 * MINUTE + dt.timedelta(seconds=1)) == 1
    assert fire_times_of(s) == [t0, t0 + 2 * MINUTE]


@pytest.mark.django_db
def test_overlap_allow_fires_regardless(user, leader):
    t0 = an_hour_ago_on_the_minute()
    leading_since(leader, t0 - dt.timedelta(hours=1))
    s = due_at(schedule(user), t0)
    firer = CronFirer(leadership=leader)
    firer.run_once(now=t0 + dt.timedelta(seconds=1))
    firer.run_once(now=t0 + MINUTE + dt.timedelta(seconds=1))
    assert fire_times_of(s) == [t0, t0 + MINUTE]


@pytest.mark.django_db
def test_edits_apply_at_the_next_tick_and_disabling_is_not_downtime(user, leader):
    t0 = an_hour_ago_on_the_minute()
    leading_since(leader, t0 - dt.timedelta(hours=1))
    firer = CronFirer(leadership=leader)
    s = schedule(user, cron="0 0 1 1 *", misfire_policy="catch_up")  # yearly
    # Recomputed from the clock at the edit (clock_timestamp(), not the transaction's now(): a
    # minute boundary between the test's start and the edit made the next fire two minutes on).
    before = schedules.db_now()
    s = schedules.schedule_update(schedule_id=s.id, changes={"cron": "* * * * *"})
    assert before < s.next_fire_at <= schedules.db_now() + MINUTE
    s = due_at(s, t0)
    assert firer.run_once(now=t0 + dt.timedelta(seconds=1)) == 1

    s = schedules.schedule_update(schedule_id=s.id, changes={"enabled": False})
    assert (s.next_fire_at, schedules.schedule_next_fire_times(s)) == (None, [])
    assert firer.run_once(now=t0 + dt.timedelta(minutes=30)) == 0
    # Re-enabled: even "catch_up" fires nothing for the disabled span; the next fire is the next due time.
    before = schedules.db_now()
    s = schedules.schedule_update(schedule_id=s.id, changes={"enabled": True})
    assert before < s.next_fire_at <= schedules.db_now() + MINUTE
    assert firer.run_once(now=db_now()) == 0
    assert fire_times_of(s) == [t0]

    # A name or template edit leaves the timetable alone and applies from the next fire.
    s = due_at(s, t0 + 2 * MINUTE)
    s = schedules.schedule_update(schedule_id=s.id, changes={"name": "renamed", "job": {"payload": {"v": 2}}})
    assert s.next_fire_at == t0 + 2 * MINUTE
    assert firer.run_once(now=t0 + 2 * MINUTE) == 1
    newest = Job.objects.filter(schedule_id=s.id).order_by("-fire_time").first()
    assert (newest.name, newest.payload, newest.type, newest.fire_time) == (
        "renamed",
        {"v": 2},
        "DEMO_TASK",
        t0 + 2 * MINUTE,
    )


@pytest.mark.django_db
def test_a_deleted_schedule_fires_nothing_and_keeps_its_jobs(user, leader):
    t0 = an_hour_ago_on_the_minute()
    leading_since(leader, t0 - dt.timedelta(hours=1))
    s = due_at(schedule(user), t0)
    firer = CronFirer(leadership=leader)
    firer.run_once(now=t0 + dt.timedelta(seconds=1))
    job = Job.objects.get(schedule_id=s.id)
    schedules.schedule_delete(schedule_id=s.id)
    assert firer.run_once(now=t0 + 5 * MINUTE) == 0
    job.refresh_from_db()
    assert (job.schedule_id, job.fire_time) == (None, t0)


@pytest.mark.django_db
def test_dst_fall_back_through_the_firer(user, leader):
    # A tick every 10 minutes across New York's 2024 fall-back (06:00Z): the fixed entry fires once,
    # at its first occurrence; the real-time entry fires in both passes.
    start = dt.datetime(2024, 11, 3, 4, 0, tzinfo=UTC)
    leading_since(leader, start - dt.timedelta(hours=1))
    fixed = schedule(user, cron="30 1 * * *", timezone="America/New_York")
    real_time = schedule(user, cron="*/30 * * * *", timezone="America/New_York")
    for s in (fixed, real_time):
        due_at(s, schedules.schedule_spec(s).next_after(start))
    firer = CronFirer(leadership=leader)
    t = start
    while t <= dt.datetime(2024, 11, 3, 8, 0, tzinfo=UTC):
        firer.run_once(now=t)
        t += dt.timedelta(minutes=10)
    assert [f.strftime("%H:%M") for f in fire_times_of(fixed)] == ["05:30"]
    assert [f.strftime("%H:%M") for f in fire_times_of(real_time)] == [
        "04:30",
        "05:00",
        "05:30",  # 01:30 EDT
        "06:00",  # 01:00 EST
        "06:30",  # 01:30 EST
        "07:00",
        "07:30",
        "08:00",
    ]


@pytest.mark.django_db
def test_a_stale_leader_is_stopped_by_its_fencing_token(user, leaders, role):
    t0 = an_hour_ago_on_the_minute()
    old, new = leaders(), leaders()
    assert old.acquire_or_renew()
    leading_since(old, t0 - dt.timedelta(hours=1))
    s = due_at(schedule(user), t0)
    # The old leader pauses past its TTL (lock deleted rather than waited for); the new one takes over.
    get_redis_connection("default").delete(lock_key(role))
    assert new.acquire_or_renew()
    leading_since(new, t0 - dt.timedelta(hours=1))
    assert old.is_leader  # locally it has not noticed yet
    assert CronFirer(leadership=old).run_once(now=t0 + dt.timedelta(seconds=1)) == 0
    assert (old.is_leader, old.token) == (False, None)  # fenced out: its term is over
    assert not Job.objects.filter(schedule_id=s.id).exists()
    assert CronFirer(leadership=new).run_once(now=t0 + dt.timedelta(seconds=1)) == 1


@pytest.mark.django_db(transaction=True)
def test_two_leaders_racing_on_their_own_connections_fire_each_time_once(user, leaders, role):
    # The old leader's write and the new one's run at the same time on different connections: the
    # fence row lock serializes them, and the older token loses wherever it lands.
    t0 = an_hour_ago_on_the_minute()
    old, new = leaders(), leaders()
    assert old.acquire_or_renew()
    made = [due_at(schedule(user, name=f"s{i}", misfire_policy="catch_up"), t0) for i in range(40)]
    get_redis_connection("default").delete(lock_key(role))
    assert new.acquire_or_renew()
    for lead in (old, new):
        leading_since(lead, t0 - dt.timedelta(hours=1))
    barrier = threading.Barrier(2)
    counts: dict[str, int] = {}
    errors: list[BaseException] = []

    def run(name: str, lead: Leadership) -> None:
        try:
            firer = CronFirer(leadership=lead, batch_size=5)
            barrier.wait()
            counts[name] = sum(firer.run_once(now=t0 + k * MINUTE + dt.timedelta(seconds=1)) for k in range(3))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(n, lead)) for n, lead in (("old", old), ("new", new))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert counts["old"] == 0
    assert counts["new"] == 3 * len(made)
    for s in made:
        assert fire_times_of(s) == [t0, t0 + MINUTE, t0 + 2 * MINUTE]


@pytest.mark.django_db
def test_fires_continue_under_the_advisory_lock_and_nothing_doubles_when_redis_returns(settings, admin_user, leaders):
    server = RedisServer()
    server.start()
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": server.url}}
    second = dt.timedelta(seconds=1)
    t0 = an_hour_ago_on_the_minute()
    s = due_at(schedule(admin_user, interval_seconds=1, misfire_policy="catch_up"), t0)  # ADMIN: no minimum
    a, b = leaders(), leaders()
    firers = {a: CronFirer(leadership=a), b: CronFirer(leadership=b)}
    fired: dict[Leadership, int] = {a: 0, b: 0}
    t = t0

    def tick() -> None:
        nonlocal t
        for lead in (a, b):
            lead.acquire_or_renew()
        for lead in (a, b):
            fired[lead] += firers[lead].run_once(now=t)
        t += second

    try:
        for _ in range(5):
            tick()
        assert (a.mode, b.token, fired[a]) == ("redis", None, 5)
        server.stop()
        for _ in range(5):
            tick()
        assert (a.mode, b.token, fired[a]) == ("postgres", None, 10)  # A kept firing under the advisory lock
        server.start()
        # B reaches the returned Redis first and claims a newer token: A's next write is refused.
        assert b.acquire_or_renew() and b.mode == "redis"
        assert a.is_leader
        assert firers[a].run_once(now=t) == 0
        assert a.token is None
        for _ in range(5):
            tick()
        assert (b.mode, a.token, fired[b]) == ("redis", None, 5)
    finally:
        server.close()
    assert fire_times_of(s) == [t0 + k * second for k in range(15)]  # every second exactly once


@pytest.mark.django_db
def test_a_fire_due_during_a_handover_is_late_not_missed(user, leaders, role):
    # A rolling restart at a minute's turn: the old leader stops (SIGTERM) just after the fire
    # was due and before it fired; the successor's term begins a few milliseconds later.
    old, new = leaders(), leaders()
    assert old.acquire_or_renew()
    assert not new.acquire_or_renew()  # running, waiting for the lock
    with connections["default"].cursor() as cursor:  # the old leader has led for ten minutes
        cursor.execute(
            "UPDATE stint_leader_fence SET led_since = led_since - interval '10 minutes' WHERE role = %s", [role]
        )
    now = db_now()
    s = due_at(schedule(user, misfire_policy="none"), now - dt.timedelta(seconds=1))
    time.sleep(0.1)
    old.release()
    assert new.acquire_or_renew()

    CronFirer(leadership=new).run_once(now=now + dt.timedelta(milliseconds=40))

    assert fire_times_of(s) == [now - dt.timedelta(seconds=1)]


@pytest.mark.django_db(transaction=True)
def test_a_leader_frozen_inside_its_fire_transaction_loses_its_session_after_a_lock_ttl(user, role):
    # A leader SIGSTOPped (or its host stalled) between two statements of a fire holds the fence row
    # and its schedules' rows: its successor waited for the server's idle-in-transaction bound
    # (STINT_DB_IDLE_IN_TRANSACTION_SECONDS, 60 s by default) instead of the lock TTL.
    t0 = an_hour_ago_on_the_minute()
    s = due_at(schedule(user, misfire_policy="catch_up"), t0)
    old = Leadership(role=role, ttl_seconds=1, redis_retry_seconds=0)
    assert old.acquire_or_renew()
    leading_since(old, t0 - MINUTE)
    frozen, thaw = threading.Event(), threading.Event()
    outcome: list[BaseException | int] = []

    class FrozenFirer(CronFirer):
        def _fire(self, rows, **kwargs) -> int:
            frozen.set()
            thaw.wait(60)  # idle inside the transaction, holding its row locks, as a stopped process
            return super()._fire(rows, **kwargs)

    def run_old() -> None:
        try:
            outcome.append(FrozenFirer(leadership=old).run_once(now=t0 + dt.timedelta(seconds=1)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run_old)
    thread.start()
    try:
        assert frozen.wait(30)
        with connections["default"].cursor() as cursor:  # the server ends the frozen session by itself
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone()[0] == 1
            deadline = time.monotonic() + 30  # far beyond the 1 s bound; 60 s without it
            while time.monotonic() < deadline:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
                )
                if cursor.fetchone()[0] == 0:
                    break
                time.sleep(0.1)
            else:
                pytest.fail("the frozen leader's session still holds its transaction")
        get_redis_connection("default").delete(lock_key(role))
        new = Leadership(role=role, ttl_seconds=10, redis_retry_seconds=0)
        assert new.acquire_or_renew()
        leading_since(new, t0 - MINUTE)
        assert CronFirer(leadership=new).run_once(now=t0 + dt.timedelta(seconds=2)) == 1
    finally:
        thaw.set()
        thread.join()
        for lead in (old, locals().get("new")):
            if lead is not None:
                lead.release()

    assert fire_times_of(s) == [t0]
    (ended,) = outcome  # the old leader, thawed, finds its session gone and writes nothing
    assert isinstance(ended, Exception), ended


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("cron", "fires"),
    [
        # A step larger than its field: minute 0 of every hour, as croniter computed it when it was stored.
        ("*/1000 * * * *", [dt.datetime(2026, 3, 2, h, 0, tzinfo=UTC) for h in (10, 11, 12)]),
        # 'W' (nearest weekday), refused on write now: 2026-03-01 is a Sunday, so the 2nd; then two weekdays.
        ("0 0 1W * *", [dt.datetime(2026, m, d, 0, 0, tzinfo=UTC) for m, d in ((3, 2), (4, 1), (5, 1))]),
    ],
)
def test_a_stored_schedule_in_a_form_now_refused_on_write_keeps_firing(user, leader, cron, fires):
    """A form the API refuses since it was stored keeps its old timetable: an upgrade stops no schedule."""
    s = schedule(user, cron="0 * * * *")
    CronSchedule.objects.filter(id=s.id).update(cron=cron)  # stored before the write check existed
    s = due_at(s, fires[0])
    leading_since(leader, fires[0] - dt.timedelta(hours=1))

    assert CronFirer(leadership=leader).run_once(now=fires[0] + dt.timedelta(seconds=1)) == 1
    s.refresh_from_db()
    assert fire_times_of(s) == [fires[0]]
    assert s.next_fire_at == fires[1]
    assert schedules.schedule_next_fire_times(s, count=2) == fires[1:]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("fields", "refused"),
    [({"job_timeout_seconds": 0}, "job_timeout_range"), ({"job_max_retries": 11}, "job_max_retries_range")],
)
def test_a_schedule_whose_job_the_database_refuses_stops_alone_and_the_others_fire(
    user, leader, fields, refused, caplog
):
    """A template edited by hand past a job's range failed the whole batch's insert, every tick: no schedule fired.

    The schedule table's own checks are looser than the job's (a timeout of 0, 11 retries), so such
    a row can be stored. Like one whose timetable cannot be planned, it stops (no next fire) and is logged.
    """
    t0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
    bad = due_at(schedule(user, name="bad", cron="0 * * * *"), t0)
    good = due_at(schedule(user, name="good", cron="0 * * * *"), t0)
    CronSchedule.objects.filter(id=bad.id).update(**fields)
    leading_since(leader, t0 - dt.timedelta(hours=1))

    assert CronFirer(leadership=leader).run_once(now=t0 + dt.timedelta(seconds=1)) == 1

    assert fire_times_of(good) == [t0]
    assert fire_times_of(bad) == []
    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.next_fire_at, good.next_fire_at) == (None, t0 + dt.timedelta(hours=1))
    assert f"cron: schedule {bad.id}'s job cannot be stored; it will not fire" in caplog.text
    assert refused in caplog.text
    # The next tick has nothing of it to fail on.
    assert CronFirer(leadership=leader).run_once(now=t0 + dt.timedelta(hours=1, seconds=1)) == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("payload_sql", "why"),
    [
        # jsonb keeps 5,001 digits; Python reads at most 4,300 (sys.get_int_max_str_digits()).
        ("""'{"n": 1e5000}'::jsonb""", "it holds a number of more than 4300 digits"),
        # jsonb nests deeper than Python's json module can read (its recursion limit).
        ("""(repeat('[', 5000) || repeat(']', 5000))::jsonb""", "it nests deeper than Python can read"),
    ],
    ids=["a number of 5001 digits", "nested 5000 deep"],
)
def test_a_schedule_whose_payload_python_cannot_read_stops_alone_and_the_others_fire(
    user, leader, payload_sql, why, caplog
):
    """A template payload edited by hand that jsonb holds but Python cannot read failed every tick: none fired."""
    t0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
    bad = due_at(schedule(user, name="bad", cron="0 * * * *"), t0)
    good = due_at(schedule(user, name="good", cron="0 * * * *"), t0)
    with connections["default"].cursor() as cursor:
        cursor.execute(f"UPDATE stint_schedule SET job_payload = {payload_sql} WHERE id = %s", [bad.id])  # noqa: S608
    leading_since(leader, t0 - dt.timedelta(hours=1))

    assert CronFirer(leadership=leader).run_once(now=t0 + dt.timedelta(seconds=1)) == 1

    assert fire_times_of(good) == [t0]
    assert fire_times_of(bad) == []
    assert list(CronSchedule.objects.filter(id__in=[bad.id, good.id]).order_by("name").values_list("next_fire_at")) == [
        (None,),
        (t0 + dt.timedelta(hours=1),),
    ]
    # The words the API's ``unreadable`` and the pages use (core.stored_json), not "cannot be stored".
    assert f"cron: schedule {bad.id}'s job payload cannot be read ({why}); it will not fire" in caplog.text
    # The next tick has nothing of it to fail on.
    assert CronFirer(leadership=leader).run_once(now=t0 + dt.timedelta(hours=1, seconds=1)) == 1
