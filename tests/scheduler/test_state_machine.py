"""The one state machine: every (state, action) pair, every table pair, and random action sequences.

States are set up with ``Job.objects.filter(...).update(status=...)``: a fixture shortcut only;
production code moves status through ``scheduler.lifecycle``'s verbs. The table tests drive the
verbs' private builder (``lifecycle._transition_one``) with every pair; the property-based runs
drive the verbs themselves.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid

import pytest
from django.utils import timezone
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from accounts.models import User
from scheduler import enqueuing, job_actions, lifecycle
from scheduler.exceptions import IllegalTransition
from scheduler.lifecycle import AttemptEnd
from scheduler.models import Job, OutboxEvent
from scheduler.states import CANCELLABLE, TRANSITIONS, AttemptStatus, EventType, JobStatus, sources_of

pytestmark = pytest.mark.django_db


S = JobStatus
ALL = list(JobStatus)

# The API's actions and what each does from every state, written out independently of TRANSITIONS
# (test_the_action_table_agrees_with_transitions ties the two together).
# state -> (HTTP status, status afterwards, event written) ; absent: 409 and nothing changes.
CANCEL = {
    S.CREATED: (200, S.CANCELLED, EventType.JOB_CANCELLED),
    S.SCHEDULED: (200, S.CANCELLED, EventType.JOB_CANCELLED),
    S.QUEUED: (200, S.CANCELLED, EventType.JOB_CANCELLED),
    S.RETRYING: (200, S.CANCELLED, EventType.JOB_CANCELLED),
    S.RUNNING: (202, S.RUNNING, None),  # only cancel_requested; the worker stops it
}
RETRY = {S.FAILED: (200, S.RETRYING, EventType.JOB_RETRIED)}
RECOVER = {S.DEAD: (200, S.QUEUED, EventType.JOB_RECOVERED)}
ACTIONS = {"cancel": CANCEL, "retry": RETRY, "recover": RECOVER}
MAX_JOBS = 4  # per property-based run


def _job(owner, status: JobStatus) -> Job:
    job = enqueuing.enqueue("DEMO_TASK", owner=owner)
    extra = {"attempts": 1, "lease_token": uuid.uuid4(), "lease_owner": "w"} if status == S.RUNNING else {}
    Job.objects.filter(id=job.id).update(status=status, **extra)
    return Job.objects.get(id=job.id)


def _snapshot(job_id) -> tuple[dict, list]:
    row = Job.objects.filter(id=job_id).values().get()
    events = list(OutboxEvent.objects.filter(job_id=job_id).order_by("sequence").values_list("id", flat=True))
    return row, events


def test_the_action_table_agrees_with_transitions():
    assert {s for s, (_, to, _) in CANCEL.items() if to == S.CANCELLED} == set(CANCELLABLE)
    assert set(CANCEL) == set(sources_of(S.CANCELLED))
    for table in ACTIONS.values():
        for source, (_, to, event) in table.items():
            if to != source:
                assert TRANSITIONS[(source, to)] == event


@pytest.mark.parametrize(("action", "state"), list(itertools.product(ACTIONS, ALL)))
def test_every_action_from_every_state(admin_api, user, action, state):
    # Through the API as an ADMIN, so that recover is allowed and only the state decides.
    job = _job(user, state)
    before_row, before_events = _snapshot(job.id)

    resp = admin_api.post(f"/api/jobs/{job.id}/{action}")

    outcome = ACTIONS[action].get(state)
    after_row, after_events = _snapshot(job.id)
    if outcome is None:
        assert resp.status_code == 409, resp.content
        assert resp.json()["error"]["code"] == "invalid_state"
        assert (after_row, after_events) == (before_row, before_events)
        return
    code, to, event = outcome
    assert resp.status_code == code, resp.content
    assert resp.json()["status"] == after_row["status"] == to
    new_events = OutboxEvent.objects.filter(job_id=job.id, sequence__gt=before_row["event_sequence"])
    if event is None:
        assert after_events == before_events
        assert after_row["cancel_requested"] is True
    else:
        assert [(e.event_type, e.from_status, e.to_status) for e in new_events] == [(event, state, to)]
        assert after_row["event_sequence"] == before_row["event_sequence"] + 1


@pytest.mark.parametrize(("from_", "to"), list(itertools.product(ALL, ALL)))
def test_every_pair_of_the_table_through_the_one_writer(user, from_, to):
    job = _job(user, from_)
    before = _snapshot(job.id)

    if (from_, to) not in TRANSITIONS:
        with pytest.raises(IllegalTransition):
            lifecycle._transition_one(job_id=job.id, to=to, expected=from_)
        assert _snapshot(job.id) == before
        return

    moved = lifecycle._transition_one(job_id=job.id, to=to, expected=from_)

    assert moved is not None
    assert (moved.from_status, moved.sequence) == (from_, before[0]["event_sequence"] + 1)
    event = OutboxEvent.objects.get(job_id=job.id, sequence=moved.sequence)
    assert (event.event_type, event.from_status, event.to_status) == (TRANSITIONS[(from_, to)], from_, to)
    assert Job.objects.get(id=job.id).status == to


@pytest.mark.parametrize(("from_", "to"), sorted(TRANSITIONS))
def test_an_allowed_move_from_the_wrong_state_changes_nothing(user, from_, to):
    # The guard: the UPDATE only wins while the job is still in the expected state.
    for actual in ALL:
        if actual == from_:
            continue
        job = _job(user, actual)
        before = _snapshot(job.id)
        assert lifecycle._transition_one(job_id=job.id, to=to, expected=from_) is None
        assert _snapshot(job.id) == before


def test_a_fenced_move_needs_the_current_lease_token(user):
    job = _job(user, S.RUNNING)
    before = _snapshot(job.id)
    assert lifecycle._transition_one(job_id=job.id, to=S.SUCCESS, expected=S.RUNNING, lease_token=uuid.uuid4()) is None
    assert _snapshot(job.id) == before
    assert lifecycle._transition_one(job_id=job.id, to=S.SUCCESS, expected=S.RUNNING, lease_token=job.lease_token)


# --- property-based: random action sequences against the real services and lifecycle ----------


class JobMachine(RuleBasedStateMachine):
    """A few jobs driven by random owner/admin actions and simulated worker, promoter and rescuer steps.

    Each step reads the job first, works out from TRANSITIONS (and the lease fence) whether the
    step may move it, performs it for real, and checks it moved exactly as allowed with exactly
    one new event; the invariant checks every job's whole event trail after every step. Worker
    steps pick a job in a state a real worker would act on (so runs reach SUCCESS, DEAD and
    recover); the API actions and ``any_table_move`` pick any job, legal or not. New jobs keep
    arriving, so a cancelled one does not end the run.
    """

    owner: User  # bound per test run (see the test below): users are slow to make
    admin: User

    def __init__(self) -> None:
        super().__init__()
        self.status: dict[uuid.UUID, JobStatus] = {}  # as of the last step, to choose jobs
        self.tokens: dict[uuid.UUID, list[uuid.UUID]] = {}  # lease tokens handed out, newest last

    # -- choosing a job --

    def _in(self, *states: JobStatus) -> list[uuid.UUID]:
        # Creation order, never uuid order: a replayed example must pick the same job again.
        return [i for i, s in self.status.items() if not states or s in states]

    def _running_with_token(self) -> list[uuid.UUID]:
        return [i for i in self._in(S.RUNNING) if self.tokens[i]]

    @staticmethod
    def _pick(data: st.DataObject, ids: list[uuid.UUID]) -> uuid.UUID:
        return data.draw(st.sampled_from(ids), label="job")

    def _pick_preferring(self, data: st.DataObject, *states: JobStatus) -> uuid.UUID:
        # Half the time a job the action is legal for, if any, so runs get past it; else any job.
        preferred = self._in(*states)
        if preferred and data.draw(st.booleans(), label="legal"):
            return self._pick(data, preferred)
        return self._pick(data, self._in())

    # -- checking one step --

    def _row(self, job_id: uuid.UUID) -> Job:
        return Job.objects.get(id=job_id)

    def _expect(self, before: Job, to: JobStatus | None) -> None:
        # One event per move: the invariant proves the outbox trail is 1..event_sequence with each
        # event leaving the status the previous one entered, so counting event_sequence suffices.
        after = self._row(before.id)
        self.status[before.id] = JobStatus(after.status)
        if to is None:
            assert (after.status, after.event_sequence) == (before.status, before.event_sequence)
        else:
            assert (after.status, after.event_sequence) == (to, before.event_sequence + 1)

    def _service(self, job_id: uuid.UUID, call, allowed: dict[JobStatus, JobStatus]) -> None:
        before = self._row(job_id)
        to = allowed.get(JobStatus(before.status))
        if before.status == S.RUNNING and call is job_actions.job_cancel:
            call(job_id=job_id, actor=self.owner)
            assert self._row(job_id).cancel_requested
            self._expect(before, None)
            return
        if to is None:
            with pytest.raises(IllegalTransition):
                call(job_id=job_id, actor=self.admin)
        else:
            call(job_id=job_id, actor=self.admin)
        self._expect(before, to)

    def _move(self, job_id: uuid.UUID, to_for: dict[JobStatus, JobStatus], act, token: uuid.UUID | None = None) -> bool:
        # ``act`` performs the step and returns what moved; it may move the job only as to_for allows.
        before = self._row(job_id)
        status = JobStatus(before.status)
        target = to_for.get(status) or next(iter(to_for.values()))
        fenced_out = token is not None and token != before.lease_token
        legal = status in to_for and not fenced_out
        moved = act()
        assert bool(moved) == legal
        self._expect(before, target if legal else None)
        return legal

    @staticmethod
    def _end(job_id: uuid.UUID, token: uuid.UUID, status: AttemptStatus, **fields) -> list[AttemptEnd]:
        return [AttemptEnd(job_id=job_id, lease_token=token, status=status, worker="pbt-worker", **fields)]

    def _after_failure(self, job_id: uuid.UUID) -> JobStatus:
        # Out of attempts the same failure dead-letters the job (DESIGN.md: RUNNING -> DEAD).
        return S.RETRYING if self._row(job_id).attempts_left > 0 else S.DEAD

    # -- new jobs --

    @initialize(later=st.booleans(), max_retries=st.integers(min_value=1, max_value=2))
    def first_job(self, later: bool, max_retries: int) -> None:
        self.create(later, max_retries)

    @precondition(lambda self: len(self.status) < MAX_JOBS)
    @rule(later=st.booleans(), max_retries=st.integers(min_value=1, max_value=2))
    def create(self, later: bool, max_retries: int) -> None:
        when = timezone.now() + dt.timedelta(hours=1) if later else None
        # A queue of its own (earlier examples' jobs stay in the test's transaction), so that the
        # real claim of one job of that queue claims exactly this job.
        queue = f"pbt-{uuid.uuid4().hex}"
        job = enqueuing.enqueue("DEMO_TASK", owner=self.owner, scheduled_at=when, max_retries=max_retries, queue=queue)
        assert job.status == (S.SCHEDULED if later else S.QUEUED)
        self.status[job.id], self.tokens[job.id] = JobStatus(job.status), []

    # -- the owner's and admin's actions, on any job --

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = self._pick_preferring(data, S.RUNNING, *CANCELLABLE)
        self._service(job_id, job_actions.job_cancel, {s: S.CANCELLED for s in CANCELLABLE})

    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        self._service(self._pick_preferring(data, S.FAILED), job_actions.job_retry, {S.FAILED: S.RETRYING})

    @rule(data=st.data())
    def recover(self, data: st.DataObject) -> None:
        self._service(self._pick_preferring(data, S.DEAD), job_actions.job_recover, {S.DEAD: S.QUEUED})

    # -- any pair of the table on any job: from the wrong state it must change nothing --

    @rule(data=st.data(), pair=st.sampled_from(sorted(TRANSITIONS)))
    def any_table_move(self, data: st.DataObject, pair: tuple[JobStatus, JobStatus]) -> None:
        from_, to = pair
        job_id = self._pick(data, self._in())
        self._move(job_id, {from_: to}, lambda: lifecycle._transition_one(job_id=job_id, to=to, expected=from_))

    # -- the scheduler's and worker's steps, through the same verbs the real ones call --

    @precondition(lambda self: self._in(S.SCHEDULED, S.RETRYING))
    @rule(data=st.data())
    def promote(self, data: st.DataObject) -> None:
        job_id = self._pick(data, self._in(S.SCHEDULED, S.RETRYING))
        source = self.status[job_id]
        assert self._move(job_id, {source: S.QUEUED}, lambda: lifecycle.promote([job_id], source=source))

    @precondition(lambda self: self._in(S.QUEUED))
    @rule(data=st.data())
    def claim(self, data: st.DataObject) -> None:
        job_id = self._pick(data, self._in(S.QUEUED))
        queue = self._row(job_id).queue
        claimed = []

        def act():
            claimed.extend(lifecycle.claim(worker_id="pbt-worker", limit=1, lease_seconds=30, queues=[queue]))
            return claimed

        assert self._move(job_id, {S.QUEUED: S.RUNNING}, act)
        assert [c.id for c in claimed] == [job_id]
        self.tokens[job_id].append(claimed[0].lease_token)

    @precondition(lambda self: self._running_with_token())
    @rule(data=st.data(), outcome=st.sampled_from(["complete", "retryable", "permanent", "stopped"]))
    def worker_reports(self, data: st.DataObject, outcome: str) -> None:
        job_id = self._pick(data, self._running_with_token())
        token = self.tokens[job_id][-1]
        if outcome == "complete":
            end = self._end(job_id, token, AttemptStatus.SUCCEEDED, result={"ok": True})
            self._move(job_id, {S.RUNNING: S.SUCCESS}, lambda: lifecycle.complete(end), token)
        elif outcome == "retryable":
            end = self._end(job_id, token, AttemptStatus.FAILED, error="boom")
            if self._after_failure(job_id) == S.RETRYING:
                self._move(job_id, {S.RUNNING: S.RETRYING}, lambda: lifecycle.retry_later(end, delays=[0.0]), token)
            else:
                self._move(job_id, {S.RUNNING: S.DEAD}, lambda: lifecycle.dead_letter(end), token)
        elif outcome == "permanent":
            end = self._end(job_id, token, AttemptStatus.FAILED, error="no")
            self._move(job_id, {S.RUNNING: S.FAILED}, lambda: lifecycle.fail(end), token)
        elif self._row(job_id).cancel_requested:  # a worker stops a handler only once asked to
            end = self._end(job_id, token, AttemptStatus.CANCELLED)
            self._move(job_id, {S.RUNNING: S.CANCELLED}, lambda: lifecycle.cancel_running(end), token)

    def _leased(self) -> list[uuid.UUID]:
        # What the rescuer can find: RUNNING with a lease (a table move into RUNNING may leave none).
        held = set(
            Job.objects.filter(id__in=self._in(S.RUNNING), lease_token__isnull=False).values_list("id", flat=True)
        )
        return [i for i in self._in(S.RUNNING) if i in held]

    @precondition(lambda self: self._leased())
    @rule(data=st.data())
    def lease_expires(self, data: st.DataObject) -> None:
        # The rescuer takes the job from whichever worker held it: fenced by the token it read.
        job_id = self._pick(data, self._leased())
        row = self._row(job_id)
        to = S.CANCELLED if row.cancel_requested else self._after_failure(job_id)
        end = self._end(job_id, row.lease_token, AttemptStatus.LOST, error="lease expired", reason="lease_expired")
        self._move(job_id, {S.RUNNING: to}, lambda: lifecycle.rescue_leases(end, next_statuses=[to], delays=[0.0]))

    @precondition(lambda self: any(len(t) > 1 for t in self.tokens.values()))
    @rule(data=st.data(), to=st.sampled_from([S.SUCCESS, S.FAILED, S.RETRYING]))
    def stale_worker_reports(self, data: st.DataObject, to: JobStatus) -> None:
        # A worker whose lease was rescued reports late: its old token must move nothing.
        job_id = self._pick(data, [i for i, t in self.tokens.items() if len(t) > 1])
        stale = self.tokens[job_id][-2]
        end = self._end(job_id, stale, AttemptStatus.SUCCEEDED if to == S.SUCCESS else AttemptStatus.FAILED)
        verb = {
            S.SUCCESS: lambda: lifecycle.complete(end),  # complete takes SUCCEEDED ends only
            S.FAILED: lambda: lifecycle.fail(end),
            S.RETRYING: lambda: lifecycle.retry_later(end, delays=[0.0]),
        }[to]
        assert not self._move(job_id, {S.RUNNING: to}, verb, stale)

    # -- invariant --

    @invariant()
    def every_event_trail_is_its_jobs_status_history(self) -> None:
        trails: dict[uuid.UUID, list[tuple[int, str, str]]] = {i: [] for i in self.status}
        for job_id, seq, from_, to in (
            OutboxEvent.objects.filter(job_id__in=list(self.status))
            .order_by("job_id", "sequence")
            .values_list("job_id", "sequence", "from_status", "to_status")
        ):
            trails[job_id].append((seq, from_, to))
        for job in Job.objects.filter(id__in=list(self.status)):
            trail = trails[job.id]
            assert job.status in JobStatus.values
            assert [seq for seq, _, _ in trail] == list(range(1, len(trail) + 1))  # no gaps, no duplicates
            assert trail[0][1:] == ("", S.CREATED)
            for (_, _, prev_to), (_, from_, to) in itertools.pairwise(trail):
                assert from_ == prev_to  # no skipped transition
                assert (JobStatus(from_), JobStatus(to)) in TRANSITIONS
            assert trail[-1][2] == job.status
            assert job.event_sequence == len(trail)


def test_random_action_sequences_keep_the_job_legal_and_every_move_recorded(user, admin_user):
    # Every example makes fresh jobs inside this test's transaction; the two users are shared.
    machine = type("BoundJobMachine", (JobMachine,), {"owner": user, "admin": admin_user})
    run_state_machine_as_test(machine, settings=settings(max_examples=25, stateful_step_count=30, deadline=None))
