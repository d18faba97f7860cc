"""Example ``@task`` functions that `make run` loads (``STINT_EXTRA_APPS=examples``): they run on Stint."""
