"""A test-only app of hostile handlers for worker processes (``STINT_EXTRA_APPS=tests.support.hostile``)."""
