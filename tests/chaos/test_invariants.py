"""The invariant checks of chaos.invariants, on snapshots built by hand."""

from __future__ import annotations

import datetime as dt

from chaos.invariants import (
    UNRUN_ERROR,
    AttemptRow,
    EventRow,
    FenceRow,
    JobRow,
    ScheduleRow,
    Snapshot,
    check_i6,
    verdict,
)
from scheduler.maintenance import rescuer

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
CHAIN = [("", "CREATED"), ("CREATED", "QUEUED"), ("QUEUED", "RUNNING"), ("RUNNING", "SUCCESS")]


def job(job_id="j1", *, status="SUCCESS", attempts=1, base=0, max_retries=3, seq=4, payload=None, **kw) -> JobRow:
    return JobRow(
        id=job_id,
        status=status,
        attempts=attempts,
        attempts_base=base,
        max_retries=max_retries,
        event_sequence=seq,
        payload=payload if payload is not None else {"mode": "ok"},
        **kw,
    )


def events(job_id="j1", chain=CHAIN, attempts=(0, 0, 1, 1)) -> list[EventRow]:
    return [
        EventRow(job_id=job_id, event_id=f"{job_id}-e{i}", sequence=i, attempt=a, from_status=f, to_status=t)
        for i, ((f, t), a) in enumerate(zip(chain, attempts, strict=True), start=1)
    ]


def clean(**overrides) -> Snapshot:
    """One job that ran once and succeeded, with its full trail."""
    outbox = events()
    snap = Snapshot(
        created={"j1"},
        jobs={"j1": job()},
        attempts=[AttemptRow(job_id="j1", number=1, status="SUCCEEDED")],
        results={"j1": (1, "SUCCEEDED")},
        effects=[("j1", 1, 1)],
        outbox=outbox,
        audit=[(e.job_id, e.event_id, e.sequence) for e in outbox],
        kafka={e.event_id: 1 for e in outbox},
        recovery_seconds=1.0,
    )
    for key, value in overrides.items():
        setattr(snap, key, value)
    return snap


def test_a_clean_snapshot_passes():
    v = verdict(clean())
    assert v.passed, v.violations
    assert (v.lost, v.duplicates, v.audit_gaps, v.duplicate_fires) == (0, 0, 0, 0)


def test_i1_a_created_job_missing_or_stuck_is_lost():
    v = verdict(clean(created={"j1", "j2"}))
    assert v.lost == 1 and "j2" in v.violations["I1"][0]
    stuck = clean(jobs={"j1": job(status="QUEUED")})
    assert "stuck QUEUED" in verdict(stuck).violations["I1"][0]


def test_i1_a_job_scheduled_for_later_is_legitimately_pending():
    v = verdict(clean(jobs={"j1": job(status="SCHEDULED", due_later=True)}))
    assert "I1" not in v.violations


def test_i1_a_wrong_answer_to_the_load_fails():
    v = verdict(clean(anomalies=["replay gave j9, not j1"]))
    assert v.failed == ["I1"]


def test_i2_an_effect_applied_twice_for_one_attempt_is_a_duplicate():
    v = verdict(clean(effects=[("j1", 1, 2)]))
    assert v.duplicates == 1 and "applied 2 times" in v.violations["I2"][0]


def test_i2_an_effect_of_a_lost_attempt_is_allowed_but_two_succeeded_attempts_are_not():
    lost = clean(
        jobs={"j1": job(attempts=2)},
        attempts=[
            AttemptRow(job_id="j1", number=1, status="LOST"),
            AttemptRow(job_id="j1", number=2, status="SUCCEEDED"),
        ],
        results={"j1": (2, "SUCCEEDED")},
        effects=[("j1", 1, 1), ("j1", 2, 1)],
    )
    assert "I2" not in verdict(lost).violations
    both = clean(
        jobs={"j1": job(attempts=2)},
        attempts=[
            AttemptRow(job_id="j1", number=1, status="SUCCEEDED"),
            AttemptRow(job_id="j1", number=2, status="SUCCEEDED"),
        ],
        results={"j1": (2, "SUCCEEDED")},
        effects=[("j1", 1, 1), ("j1", 2, 1)],
    )
    v = verdict(both)
    assert v.duplicates == 1
    assert any("2 SUCCEEDED attempts" in s for s in v.violations["I2"])


def test_i2_an_effect_of_an_unrecorded_attempt_fails():
    v = verdict(clean(effects=[("j1", 1, 1), ("j1", 5, 1)]))
    assert "never recorded" in v.violations["I2"][0]


def test_i3_dead_before_the_last_attempt_and_over_budget_fail():
    early = clean(jobs={"j1": job(status="DEAD", attempts=1, max_retries=3)})
    assert any("DEAD after 1 of 4" in s for s in verdict(early).violations["I3"])
    over = clean(jobs={"j1": job(attempts=5, max_retries=3)})
    assert any("5 attempts used of a budget of 4" in s for s in verdict(over).violations["I3"])


def test_i3_handed_back_attempts_do_not_use_the_budget():
    rows = [AttemptRow(job_id="j1", number=n, status="LOST") for n in (1, 2)]
    rows += [AttemptRow(job_id="j1", number=n, status="FAILED") for n in (3, 4, 5)]
    rows += [AttemptRow(job_id="j1", number=6, status="FAILED")]
    snap = clean(
        jobs={"j1": job(status="DEAD", attempts=6, base=2, payload={"mode": "ok", "fail": [1, 2, 3, 4, 5, 6]})},
        attempts=rows,
        results={"j1": (6, "FAILED")},
        effects=[],
    )
    assert "I3" not in verdict(snap).violations


def test_i3_a_job_no_fault_touched_must_end_as_its_payload_says():
    snap = clean(jobs={"j1": job(status="SUCCESS", payload={"mode": "ok", "fail": [1, 2, 3, 4]})})
    assert any("say DEAD" in s for s in verdict(snap).violations["I3"])


CRASH = "worker process died (signal 9: SIGKILL) while running this job"


def _crashed_then(final: str, *, lost: int, max_retries: int, error: str = CRASH) -> Snapshot:
    """A job of an innocent payload whose first ``lost`` attempts its supervisor rescued after a crash."""
    rows = [AttemptRow(job_id="j1", number=n, status="LOST", error=error) for n in range(1, lost + 1)]
    used = lost
    if final == "SUCCESS":
        used += 1
        rows.append(AttemptRow(job_id="j1", number=used, status="SUCCEEDED"))
    return clean(
        jobs={"j1": job(status=final, attempts=used, max_retries=max_retries)},
        attempts=rows,
        results={"j1": (used, "SUCCEEDED")} if final == "SUCCESS" else {},
        effects=[("j1", used, 1)] if final == "SUCCESS" else [],
    )


def test_i3_a_crashed_attempt_counts_against_the_budget():
    """The crash policy: a LOST attempt uses the budget, so one crash with max_retries 0 is DEAD, not SUCCESS."""
    assert "I3" not in verdict(_crashed_then("DEAD", lost=1, max_retries=0)).violations
    assert "I3" not in verdict(_crashed_then("SUCCESS", lost=1, max_retries=1)).violations
    retried_past_budget = _crashed_then("SUCCESS", lost=1, max_retries=0)
    assert any("2 attempts used of a budget of 1" in s for s in verdict(retried_past_budget).violations["I3"])


def test_i3_a_job_with_budget_left_after_a_crash_must_not_end_dead():
    """After its supervisor rescued it, an innocent job with retries left runs again and succeeds."""
    snap = _crashed_then("DEAD", lost=1, max_retries=3)
    snap.jobs["j1"] = job(status="DEAD", attempts=4, max_retries=3)
    snap.attempts += [AttemptRow(job_id="j1", number=n, status="FAILED") for n in (2, 3, 4)]
    assert any("lost attempts [1] say SUCCESS" in s for s in verdict(snap).violations["I3"])


def test_i3_an_innocent_job_loses_at_most_one_attempt_to_a_poison_neighbour():
    """Isolation after the first crash: a second crash it did not cause breaks the policy, unless the harness killed."""
    twice = _crashed_then("SUCCESS", lost=2, max_retries=3)
    assert any("2 attempts lost to worker process crashes" in s for s in verdict(twice).violations["I3"])
    twice.worker_kills = 1
    assert "I3" not in verdict(twice).violations
    expired = _crashed_then("SUCCESS", lost=2, max_retries=3, error="lease expired: the worker stopped heartbeating")
    assert "I3" not in verdict(expired).violations


def test_i3_a_poison_job_may_lose_every_attempt_to_its_own_crashes():
    snap = _crashed_then("DEAD", lost=3, max_retries=2)
    snap.jobs["j1"] = job(status="DEAD", attempts=3, max_retries=2, payload={"mode": "exit"})
    assert "I3" not in verdict(snap).violations


def test_i4_a_stale_attempt_succeeding_fails():
    snap = clean(
        jobs={"j1": job(attempts=2)},
        attempts=[
            AttemptRow(job_id="j1", number=1, status="SUCCEEDED"),
            AttemptRow(job_id="j1", number=2, status="LOST"),
        ],
        results={"j1": (1, "SUCCEEDED")},
    )
    found = verdict(snap).violations["I4"]
    assert any("attempt 1 SUCCEEDED but the job is at attempt 2" in s for s in found)
    assert any("result of attempt 1 stored" in s for s in found)


def test_i4_a_broken_event_chain_fails():
    chain = [("", "CREATED"), ("CREATED", "QUEUED"), ("QUEUED", "RUNNING"), ("QUEUED", "SUCCESS")]
    outbox = events(chain=chain)
    snap = clean(outbox=outbox, audit=[(e.job_id, e.event_id, e.sequence) for e in outbox])
    assert any("leaves QUEUED but event 3 entered RUNNING" in s for s in verdict(snap).violations["I4"])


def test_i4_and_i5_read_the_reconcilers_copy_of_a_lost_event_as_the_same_event():
    # The reconciler copies a lost event (same event id) into a new outbox row: the chain and the
    # trail are unchanged (seen in the short profile's audit-kill-after-commit with a 20 s grace).
    outbox = events()
    snap = clean(outbox=outbox + outbox[:2])  # events 1 and 2 twice: the original and its copy
    assert "I4" not in verdict(snap).violations
    assert "I5" not in verdict(snap).violations


def test_i4_a_fence_token_going_back_or_an_unfenced_cron_fire_fails():
    log = [FenceRow(seq=1, txid=10, token=3), FenceRow(seq=2, txid=11, token=2)]
    v = verdict(clean(fence_log=log))
    assert any("token 2 accepted after token 3" in s for s in v.violations["I4"])
    v = verdict(clean(fence_log=[FenceRow(seq=1, txid=10, token=3)], cron_txids={"j1": 99}))
    assert any("without a fence check" in s for s in v.violations["I4"])


def test_i5_a_sequence_gap_an_unpublished_event_and_an_event_lost_everywhere_fail():
    outbox = events()
    gap = clean(outbox=outbox[:2] + outbox[3:], audit=[(e.job_id, e.event_id, e.sequence) for e in outbox])
    v = verdict(gap)
    assert any("outbox sequences [1, 2, 4]" in s for s in v.violations["I5"])
    lost = clean(kafka={}, audit=[(e.job_id, e.event_id, e.sequence) for e in outbox[:3]])
    v = verdict(lost)
    assert v.audit_gaps == 1
    assert any("in neither Kafka nor audit" in s for s in v.violations["I5"])


def test_i5_an_event_missing_from_kafka_but_audited_passes():
    # The in-memory broker loses its log on restart; the audit row proves the message was in Kafka.
    assert verdict(clean(kafka={})).passed


def test_i5_an_unpublished_event_fails():
    outbox = events()
    last = outbox[3]
    outbox[3] = EventRow(
        job_id=last.job_id,
        event_id=last.event_id,
        sequence=last.sequence,
        attempt=last.attempt,
        from_status=last.from_status,
        to_status=last.to_status,
        published=False,
    )
    assert any("never published" in s for s in verdict(clean(outbox=outbox)).violations["I5"])


def fires(schedule_id: int, times: list[dt.datetime]) -> dict[str, JobRow]:
    return {f"c{i}": job(f"c{i}", schedule_id=schedule_id, fire_time=t, seq=0) for i, t in enumerate(times)}


def sched(policy: str, *, interval=2, until=20) -> ScheduleRow:
    return ScheduleRow(
        id=1,
        interval_seconds=interval,
        policy=policy,
        first_fire=T0,
        last_required=T0 + dt.timedelta(seconds=until),
    )


def at(*seconds: int) -> list[dt.datetime]:
    return [T0 + dt.timedelta(seconds=s) for s in seconds]


def test_i6_every_grid_time_fires_without_a_fault():
    snap = Snapshot(created=set(), jobs=fires(1, at(*range(0, 21, 2))), schedules=[sched("skip")])
    assert check_i6(snap) == []
    snap.jobs = fires(1, at(*range(0, 21, 2))[:-3])
    assert any("missing" in s for s in check_i6(snap))


def test_i6_a_fire_twice_or_off_the_grid_fails():
    snap = Snapshot(created=set(), jobs=fires(1, at(*range(0, 21, 2), 4, 5)), schedules=[sched("skip")])
    found = check_i6(snap)
    assert any("4 is" not in s and "2 times" in s for s in found)
    assert any("off its 2 s grid" in s for s in found)


def test_i6_dead_window_skip_fires_only_the_latest_missed():
    dead = [(T0 + dt.timedelta(seconds=5), T0 + dt.timedelta(seconds=13, milliseconds=500))]
    # Down from 5 s to 13.5 s: 6, 8, 10, 12 were missed; skip fires 12 only.
    ok = Snapshot(
        created=set(), jobs=fires(1, at(0, 2, 4, 12, 14, 16, 18, 20)), schedules=[sched("skip")], dead_windows=dead
    )
    assert check_i6(ok) == []
    every = Snapshot(created=set(), jobs=fires(1, at(*range(0, 21, 2))), schedules=[sched("skip")], dead_windows=dead)
    assert any("missed fires fired, expected 1" in s for s in check_i6(every))


def test_i6_dead_window_skip_firing_an_older_missed_time_fails():
    dead = [(T0 + dt.timedelta(seconds=5), T0 + dt.timedelta(seconds=13, milliseconds=500))]
    snap = Snapshot(
        created=set(), jobs=fires(1, at(0, 2, 4, 8, 14, 16, 18, 20)), schedules=[sched("skip")], dead_windows=dead
    )
    assert any("not the latest missed" in s for s in check_i6(snap))


def test_i6_dead_window_none_fires_nothing_missed_and_catch_up_everything():
    dead = [(T0 + dt.timedelta(seconds=5), T0 + dt.timedelta(seconds=13, milliseconds=500))]
    none_ok = Snapshot(
        created=set(), jobs=fires(1, at(0, 2, 4, 14, 16, 18, 20)), schedules=[sched("none")], dead_windows=dead
    )
    assert check_i6(none_ok) == []
    none_bad = Snapshot(
        created=set(), jobs=fires(1, at(0, 2, 4, 12, 14, 16, 18, 20)), schedules=[sched("none")], dead_windows=dead
    )
    assert any("(none)" in s for s in check_i6(none_bad))
    catch_bad = Snapshot(
        created=set(), jobs=fires(1, at(0, 2, 4, 12, 14, 16, 18, 20)), schedules=[sched("catch_up")], dead_windows=dead
    )
    assert any("catch_up" in s and "missing" in s for s in check_i6(catch_bad))


def test_i6_an_outage_excuses_skip_misses_but_not_catch_up():
    window = [(T0 + dt.timedelta(seconds=5), T0 + dt.timedelta(seconds=11))]
    times = at(0, 2, 4, 12, 14, 16, 18, 20)
    assert (
        check_i6(Snapshot(created=set(), jobs=fires(1, times), schedules=[sched("skip")], outage_windows=window)) == []
    )
    missing = check_i6(
        Snapshot(created=set(), jobs=fires(1, times), schedules=[sched("catch_up")], outage_windows=window)
    )
    assert len(missing) == 3


def test_i7_and_i8():
    v = verdict(clean(running_past_lease=["jx"], recovery_seconds=None))
    assert v.failed == ["I7", "I8"]
    assert not verdict(clean(recovery_seconds=61.0, recovery_bound=60.0)).passed


def test_i3_where_only_workers_crashed_every_lost_attempt_was_rescued_at_once():
    """A killed worker process's supervisor hands its jobs to rescue at once; a lease left to expire fails."""
    expired = _crashed_then("SUCCESS", lost=1, max_retries=3, error="lease expired: the worker stopped heartbeating")
    assert "I3" not in verdict(expired).violations
    expired.rescued_at_once = True
    assert any("not rescued at once by its supervisor" in s for s in verdict(expired).violations["I3"])
    crashed = _crashed_then("SUCCESS", lost=1, max_retries=3)
    crashed.rescued_at_once = True
    assert "I3" not in verdict(crashed).violations


def test_i3_a_job_a_crashed_process_had_not_begun_is_handed_back_at_once_and_costs_no_attempt():
    """The supervisor hands back unrun the jobs its dead process had claimed but not begun (no attempt spent)."""
    unrun = _crashed_then("SUCCESS", lost=1, max_retries=0, error=UNRUN_ERROR)
    unrun.jobs["j1"] = job(status="SUCCESS", attempts=2, base=1, max_retries=0)
    unrun.rescued_at_once = True
    assert "I3" not in verdict(unrun).violations
    assert UNRUN_ERROR == rescuer.UNRUN_ERROR  # the worker's text, restated in the Django-free checker
