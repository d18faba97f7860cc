"""The seeded fault schedule and job mix of chaos.plan: reproducible, and each fault long enough to mean something."""

from __future__ import annotations

import pytest

from chaos import plan, runner
from chaos.plan import PROFILES, SCENARIO_NAMES, expected_status, fault_schedule, job_mix, rng_for
from config import db_session
from scheduler.maintenance.reconciler import minimum_reconcile_after_seconds


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_the_same_seed_gives_the_same_faults(name, profile):
    assert fault_schedule(name, PROFILES[profile], 7) == fault_schedule(name, PROFILES[profile], 7)


def test_another_seed_moves_the_faults():
    short = PROFILES["short"]
    assert fault_schedule("worker-kill", short, 1) != fault_schedule("worker-kill", short, 2)


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("seed", [1, 2, 3, 99])
@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_faults_start_inside_the_load_window_and_in_order(name, profile, seed):
    faults = fault_schedule(name, PROFILES[profile], seed)
    assert all(0 <= f.at < PROFILES[profile].load_seconds for f in faults)
    assert [f.at for f in faults] == sorted(f.at for f in faults)


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("seed", [1, 2, 3, 99])
def test_holds_outlast_what_they_must(profile, seed):
    p = PROFILES[profile]
    (stop,) = fault_schedule("worker-stop", p, seed)
    assert stop.hold > plan.LEASE_SECONDS
    (leader,) = fault_schedule("leader-stop", p, seed)
    assert leader.hold > plan.LEADER_TTL_SECONDS
    (down,) = fault_schedule("schedulers-down", p, seed)
    assert down.hold >= 3 * plan.CRON_INTERVAL_SECONDS
    (cut,) = fault_schedule("partition-h3", p, seed)
    assert cut.hold > plan.LEASE_SECONDS
    (long_cut,) = fault_schedule("partition-h3-long", p, seed)
    assert long_cut.hold - runner.RELEASE_CHECK_BEFORE_HEAL_SECONDS > plan.RELEASE_BOUND_SECONDS


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("seed", [1, 2, 3, 99])
def test_a_postgres_freeze_outlasts_two_leases_and_heals_inside_the_window(profile, seed):
    p = PROFILES[profile]
    (freeze,) = fault_schedule("pg-freeze", p, seed)
    assert (freeze.action, freeze.target) == ("sigstop", "postgres")
    assert freeze.hold > 2 * plan.LEASE_SECONDS
    assert freeze.at < p.load_seconds


def test_the_soak_freezes_postgres_past_the_api_deadline_and_the_worker_reaper(settings):
    """The soak's freeze shows what happens past both bounds (the runner leaves them at their defaults)."""
    (freeze,) = fault_schedule("pg-freeze", PROFILES["soak"], 1)
    assert freeze.hold > settings.STINT_REQUEST_DB_TIMEOUT_SECONDS
    assert freeze.hold > settings.SCHEDULER["WORKER_DEAD_AFTER_SECONDS"]


def test_the_release_bound_outlasts_the_keepalive_bounds():
    keepalives = db_session.KEEPALIVE_IDLE_SECONDS + db_session.KEEPALIVE_INTERVAL_SECONDS * db_session.KEEPALIVE_COUNT
    assert plan.RELEASE_BOUND_SECONDS > max(keepalives, db_session.TCP_USER_TIMEOUT_MS / 1000)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_broker_restart_leaves_the_reconciler_time_to_repair(profile):
    assert plan.RECONCILE_AFTER_SECONDS >= minimum_reconcile_after_seconds(
        lock_hold_seconds=plan.OUTBOX_LOCK_HOLD_SECONDS
    )
    bound = plan.recovery_bound("broker-restart", PROFILES[profile])
    assert bound >= plan.RECONCILE_AFTER_SECONDS * 1.25 + 30  # the grace, one check interval, then the rest
    assert plan.recovery_bound("worker-kill", PROFILES[profile]) == PROFILES[profile].recovery_bound_seconds


@pytest.mark.parametrize("seed", range(20))
def test_repeated_faults_are_spaced(seed):
    kills = fault_schedule("worker-kill", PROFILES["short"], seed)
    assert len(kills) == PROFILES["short"].kills
    assert all(b.at - a.at >= plan.MIN_GAP - 0.01 for a, b in zip(kills, kills[1:], strict=False))


def test_soak_holds_are_the_issues_durations():
    soak = PROFILES["soak"]
    assert fault_schedule("redis-down", soak, 1)[0].hold == 60
    assert fault_schedule("broker-pause", soak, 1)[0].hold == 30


def test_an_unknown_scenario_is_refused():
    with pytest.raises(KeyError, match="worker-kill"):
        fault_schedule("no-such-thing", PROFILES["short"], 1)


def test_job_mix_is_reproducible_and_mixes_both_paths():
    a = job_mix("standard", 400, rng_for(1, "x"), api_share=0.2)
    b = job_mix("standard", 400, rng_for(1, "x"), api_share=0.2)
    assert a == b
    vias = {j.via for j in a}
    assert vias == {"api", "enqueue"}
    assert any(j.delay_seconds for j in a)
    assert any(j.idempotency_key for j in a if j.via == "api")
    assert not any(j.idempotency_key for j in a if j.via == "enqueue")


def test_storm_fails_about_half_of_the_attempts():
    jobs = job_mix("storm", 2000, rng_for(3, "storm"), api_share=0.0)
    fails = sum(len(j.payload["fail"]) for j in jobs)
    assert 0.45 < fails / (4 * len(jobs)) < 0.55
    assert all(j.via == "enqueue" for j in jobs)


def test_poison_mix_holds_each_poison_mode():
    jobs = job_mix("poison", 1000, rng_for(5, "poison"), api_share=0.2)
    assert {j.payload["mode"] for j in jobs} == {"ok", "exit", "sysexit", "nul"}


def test_expected_status_follows_the_failure_plan():
    assert expected_status({"mode": "ok"}, 3) == "SUCCESS"
    assert expected_status({"mode": "ok", "fail": [1, 2, 3]}, 3) == "SUCCESS"
    assert expected_status({"mode": "ok", "fail": [1, 2, 3, 4]}, 3) == "DEAD"
    assert expected_status({"mode": "ok", "fail": [1, 2, 3]}, 2) == "DEAD"
    assert expected_status({"mode": "exit"}, 2) == ""
