"""Handler registry: ``@handler("TYPE")`` functions, discovered from each installed app's ``jobs.py``."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.parsers import is_storable_text
from scheduler.exceptions import JobCancelled, UnknownJobType
from scheduler.retry import MAX_BACKOFF_SECONDS, is_backoff_seconds
from scheduler.states import MAX_RETRIES_RANGE, TIMEOUT_RANGE

MAX_TYPE_LENGTH = 100  # characters: stint_job.type's max_length (scheduler.models.Job.type)

HandlerFunc = Callable[[Any, "JobContext"], Any]


class CancelFlag(Protocol):
    """Anything with ``is_set()``: a threading.Event, a multiprocessing Event."""

    def is_set(self) -> bool: ...  # noqa: D102


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerSpec:
    """A registered handler and its per-type defaults (None: use the job's or global value)."""

    name: str
    func: HandlerFunc
    timeout_seconds: int | None = None
    max_retries: int | None = None
    backoff_base_seconds: float | None = None
    backoff_max_seconds: float | None = None
    backoff_jitter: bool | None = None
    # Flow limits on this type (scheduler.flow.limits): the API's JSON shape, or None.
    limits: dict[str, Any] | None = None


@dataclass(slots=True, kw_only=True)
class JobContext:
    """What a handler gets besides its payload.

    ``job_id`` (UUID), ``attempt`` (1-based), ``owner_id`` (int or None), ``logger`` (a
    LoggerAdapter carrying job_id/attempt), ``cancelled`` (True once cancellation was
    requested; long handlers should check it or use ``sleep``), and ``attempts_left`` (attempts
    the job's budget allows after this one: a retryable error is retried while it is above 0;
    None outside a worker run).
    """

    job_id: uuid.UUID
    attempt: int
    owner_id: int | None
    logger: logging.LoggerAdapter
    cancel_flag: CancelFlag = field(default_factory=threading.Event)
    lease_token: uuid.UUID | None = None  # this run's fencing token: progress writes carry it
    attempts_left: int | None = None

    def progress(self, percent: float, message: str = "") -> None:
        """Report progress: ``percent`` a number from 0 to 100, ``message`` a short text (500 characters kept).

        Shown as ``progress`` on GET /api/jobs/{id}, the job page and the console. Call it as
        often as you like: each worker process writes the latest value of all its jobs in one
        statement once a second (``scheduler.flow.progress``). Raises ValueError for bad input;
        never fails the job for a database error.
        """
        if self.lease_token is None:
            from scheduler.flow.progress import checked

            checked(percent, message)  # outside a worker run (a direct call): validate only
            return
        from scheduler.flow.progress import writer

        writer.report(job_id=self.job_id, lease_token=self.lease_token, percent=percent, message=message)

    @property
    def cancelled(self) -> bool:
        """True once the job's cancellation was requested."""
        return self.cancel_flag.is_set()

    def check_cancelled(self) -> None:
        """Raise ``JobCancelled`` if cancellation was requested."""
        if self.cancelled:
            raise JobCancelled()

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` (float), waking every 50 ms to raise ``JobCancelled`` when cancelled."""
        deadline = time.monotonic() + seconds
        while True:
            self.check_cancelled()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            wait = getattr(self.cancel_flag, "wait", None)
            if wait is not None:
                wait(min(remaining, 0.05))
            else:
                time.sleep(min(remaining, 0.05))


_REGISTRY: dict[str, HandlerSpec] = {}
_LOCK = threading.Lock()
# Trusted sources of job types beyond @handler, e.g. the Django Tasks backend's registry of @task
# functions (stint_tasks). Each maps a name to a spec or None; none ever imports by the name.
Resolver = Callable[[str], "HandlerSpec | None"]
_RESOLVERS: list[Resolver] = []


def handler(
    name: str,
    *,
    timeout_seconds: int | None = None,
    max_retries: int | None = None,
    backoff_base_seconds: float | None = None,
    backoff_max_seconds: float | None = None,
    backoff_jitter: bool | None = None,
    concurrency: int | None = None,
    concurrency_key: str | None = None,
    concurrency_per_key: int | None = None,
    rate_limit: int | None = None,
    rate_period_seconds: float | None = None,
) -> Callable[[HandlerFunc], HandlerFunc]:
    """Register the decorated ``func(payload, ctx) -> JSON-serializable result`` for job type ``name``.

    Per-type defaults apply when a job is enqueued without its own value. Flow limits across
    every worker (``scheduler.flow.limits``): ``concurrency`` RUNNING at once; with
    ``concurrency_key`` (a payload field), at most ``concurrency_per_key`` (default 1) RUNNING
    per distinct value; ``rate_limit`` claims per ``rate_period_seconds``. Raises ValueError,
    naming the option and its range, if ``name`` is already registered to another function, is
    not 1 to ``MAX_TYPE_LENGTH`` characters of text a PostgreSQL ``varchar`` can hold (no NUL, no
    lone surrogate), ``max_retries`` or ``timeout_seconds`` is not an integer of the job spec's
    range (``states.MAX_RETRIES_RANGE``, 1-10; ``states.TIMEOUT_RANGE``, 1-3600 s: the API's, so
    every enqueue that leaves them to the handler can take them), a backoff base or cap is not a
    number of seconds from 0 to ``retry.MAX_BACKOFF_SECONDS`` (a week), ``backoff_jitter`` is not
    True or False, or a limit is invalid.
    """
    _check_type_name(name)
    for option, value, (low, high) in (
        ("max_retries", max_retries, MAX_RETRIES_RANGE),
        ("timeout_seconds", timeout_seconds, TIMEOUT_RANGE),
    ):
        # bool is an int subclass: True must not pass for 1.
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high):
            raise ValueError(
                f"@handler({name!r}): {option} must be an integer from {low} to {high}, not {value!r:.120}"
            )
    if backoff_jitter is not None and not isinstance(backoff_jitter, bool):
        raise ValueError(f"@handler({name!r}): backoff_jitter must be True or False, not {backoff_jitter!r:.120}")
    for option, value in (("backoff_base_seconds", backoff_base_seconds), ("backoff_max_seconds", backoff_max_seconds)):
        if value is not None and not is_backoff_seconds(value):
            raise ValueError(
                f"@handler({name!r}): {option} must be a number of seconds from 0 to {MAX_BACKOFF_SECONDS},"
                f" not {value!r}"
            )
    limits = {
        k: v
        for k, v in {
            "concurrency": concurrency,
            "partition_key": concurrency_key,
            "partition_concurrency": concurrency_per_key,
            "rate_limit": rate_limit,
            "rate_period_seconds": rate_period_seconds,
        }.items()
        if v is not None
    }
    if limits:
        from scheduler.exceptions import InvalidLimit
        from scheduler.flow.limits import validated

        try:
            validated(limits, scope="type", name=name, source="handler")
        except InvalidLimit as exc:
            raise ValueError(f"@handler({name!r}): {exc} {exc.details}") from None

    def decorate(func: HandlerFunc) -> HandlerFunc:
        spec = HandlerSpec(
            name=name,
            func=func,
            timeout_seconds=timeout_seconds,
            max_retries=max_retries,
            backoff_base_seconds=backoff_base_seconds,
            backoff_max_seconds=backoff_max_seconds,
            backoff_jitter=backoff_jitter,
            limits=limits or None,
        )
        with _LOCK:
            existing = _REGISTRY.get(name)
            if existing is not None and existing.func.__qualname__ != func.__qualname__:
                raise ValueError(f"job type {name!r} is already registered to {existing.func!r}")
            _REGISTRY[name] = spec
        return func

    return decorate


def _check_type_name(name: Any) -> None:
    """Raise ValueError unless ``name`` is a job type a ``stint_job.type`` column can hold."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_TYPE_LENGTH:
        raise ValueError(f"a job type is 1 to {MAX_TYPE_LENGTH} characters of text, not {name!r:.120}")
    if not is_storable_text(name):
        raise ValueError(f"a job type cannot hold a NUL character or a lone surrogate: {name!r:.120}")


UNKNOWN_TYPES_NAMED = 10  # registered types (and as many Django tasks) an unknown-type error lists


def _named(names: list[str]) -> str:
    """The first ``UNKNOWN_TYPES_NAMED`` of ``names`` (sorted), then how many more."""
    names = sorted(names)
    more = len(names) - UNKNOWN_TYPES_NAMED
    return ", ".join(names[:UNKNOWN_TYPES_NAMED]) + (f" and {more} more" if more > 0 else "")


def unknown_type_message(
    name: str, registered: list[str], tasks: Iterable[str] = (), *, tasks_by_type: bool = True
) -> str:
    """Return the error for job type ``name``, naming the ``registered`` types and the Django ``tasks``.

    Each list is sorted and cut to its first ``UNKNOWN_TYPES_NAMED``, so a typo (``DEMO`` for
    ``DEMO_TASK``) is visible in the answer itself. ``tasks_by_type`` False: the caller enqueues
    by type, which takes ``@handler`` types only (the REST API, ``scheduler.enqueue``); a Django
    task is enqueued with its own ``.enqueue()``, and the message says so.
    """
    tasks = sorted(tasks)
    if not registered and not tasks:
        return f"Unknown job type {name!r}. No job type is registered."
    message = f"Unknown job type {name!r}. " + (
        f"Registered types: {_named(registered)}." if registered else "No @handler type is registered."
    )
    if tasks:
        how = "" if tasks_by_type else " (enqueued with their .enqueue(), never by type)"
        message += f" Django tasks{how}: {_named(tasks)}."
    return message


def get_handler(name: str) -> HandlerSpec:
    """Return the ``@handler`` spec for ``name``; raise ``UnknownJobType`` (naming the registered types) when none is.

    This is enqueue by type (the REST API, the pages, schedules, ``scheduler.enqueue``), which takes
    ``@handler`` types only: the error also names the Django tasks (``add_type_source``) and
    says they are enqueued with their ``.enqueue()``; a Django task's own path gets that answer.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        tasks = task_types()
        if name in tasks:
            message = (
                f"Unknown job type {name!r} here: it is a Django task, enqueued with its .enqueue(); by type (the"
                f" REST API, schedules, scheduler.enqueue) only the registered types are:"
                f" {_named(registered_types()) or 'none'}."
            )
        else:
            message = unknown_type_message(name, registered_types(), tasks, tasks_by_type=False)
        raise UnknownJobType(message, details={"type": [message]}) from None


def _add_once(hooks: list[Any], hook: Any) -> None:
    """Append ``hook`` to ``hooks`` (a resolver or name-source list of this module) unless it is there."""
    with _LOCK:
        if hook not in hooks:
            hooks.append(hook)


def _names_from(sources: list[Callable[[], Iterable[str]]]) -> set[str]:
    """The union of what each of ``sources`` lists (a snapshot of the list: one may be added meanwhile)."""
    names: set[str] = set()
    for source in list(sources):
        names.update(source())
    return names


# Trusted sources of job types that resolvers run besides the @handlers, for error messages: the
# Django Tasks backend's task paths.
TypeSource = Callable[[], Iterable[str]]
_TYPE_SOURCES: list[TypeSource] = []


def add_type_source(source: TypeSource) -> None:
    """Let unknown-type errors also name the job types ``source() -> names`` lists (idempotent)."""
    _add_once(_TYPE_SOURCES, source)


def task_types() -> list[str]:
    """Return the job types of ``add_type_source`` sources (Django tasks' paths), sorted; no database read."""
    return sorted(_names_from(_TYPE_SOURCES))


def add_resolver(resolver: Resolver) -> None:
    """Let ``resolve`` also find job types through ``resolver(name) -> HandlerSpec | None`` (idempotent).

    A resolver must only return specs for code the project itself defined: ``resolve`` is how a
    worker turns a stored job type into a function call.
    """
    _add_once(_RESOLVERS, resolver)


# Trusted sources of the queues registered job types go to by default, e.g. the Django Tasks
# backend's @task(queue_name=...); a @handler has no queue of its own (its jobs name one, or default).
QueueSource = Callable[[], Iterable[str]]
_QUEUE_SOURCES: list[QueueSource] = []


def add_queue_source(source: QueueSource) -> None:
    """Let ``registered_queues`` also name the queues from ``source() -> names`` (idempotent)."""
    _add_once(_QUEUE_SOURCES, source)


def registered_queues() -> set[str]:
    """Return the queues some registered job type goes to by default (``add_queue_source``); no database read."""
    return _names_from(_QUEUE_SOURCES)


def resolve(name: str) -> HandlerSpec:
    """Return the spec that runs jobs of type ``name``: a ``@handler``, else one from a resolver.

    Workers (execution, per-type backoff) and trusted enqueues (the Django Tasks backend, code
    schedules) use this; the REST API, pages and ordinary ``enqueue`` validate with
    ``get_handler``, so a user can only name ``@handler`` types. Raises ``UnknownJobType``.
    """
    spec = _REGISTRY.get(name)
    if spec is not None:
        return spec
    for resolver in list(_RESOLVERS):
        spec = resolver(name)
        if spec is not None:
            return spec
    message = unknown_type_message(name, registered_types(), task_types())
    raise UnknownJobType(message, details={"type": [message]})


def handler_limits() -> dict[str, dict[str, Any]]:
    """Return {job type: its ``@handler`` flow limits (the API's JSON shape)} for handlers that set any."""
    return {name: dict(spec.limits) for name, spec in _REGISTRY.items() if spec.limits}


def registered_types() -> list[str]:
    """Return the registered job type names, sorted."""
    return sorted(_REGISTRY)


def autodiscover() -> None:
    """Import ``jobs`` from every installed app so their ``@handler``s register."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("jobs")
