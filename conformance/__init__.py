"""Django's own ``tests/tasks`` suite run against the Stint backend with a real worker (``make tasks-conformance``)."""
