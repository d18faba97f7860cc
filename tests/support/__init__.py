"""Helpers the tests share; test modules import from here, never from each other.

- ``clock``: ``FakeClock``, a monotonic clock a test moves by hand.
- ``factories``: factory-boy factories (users, jobs), ``claimed_job`` and ``worker_node``.
- ``hostile``: a test-only app of hostile handlers (``STINT_EXTRA_APPS=tests.support.hostile``).
- ``jobs``: jobs in the test database (claim as a test worker, read status/events/attempts),
  ``run_on_threads`` and the maintenance tests' settings fixture.
- ``kafka``: the real-broker fixtures (topic pool, private Tansu broker) and readers.
- ``metrics``: scraping a process's ``/metrics`` with prometheus_client's parser.
- ``net``: ``free_port``.
- ``notify``: a ``LISTEN`` connection on the workers' channel and its reader.
- ``processes``: real ``run_workers``/``run_scheduler`` processes (the ``procs`` fixture) and ``wait_until``.
- ``redis_server``: a private redis-server a test may stop and start.
- ``subprocess_env``: the ``DATABASE_URL`` of the test database, for child processes.
"""
