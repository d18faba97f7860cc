"""A test-only app of hostile handlers, plugged into worker processes with ``STINT_EXTRA_APPS=tests.hostile``."""
