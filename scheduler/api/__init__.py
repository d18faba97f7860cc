"""The jobs REST API: thin DRF views over ``enqueuing``, ``job_actions`` and ``selectors`` (of ``scheduler``)."""
