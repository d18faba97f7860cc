"""The scheduler's REST API: thin DRF views over its services and selectors.

``views`` (jobs; mounted by ``urls``), ``schedules``, ``queues`` and ``flow`` (mounted one path at
a time in ``config.urls``); ``serializers`` and ``filters`` shape what the job views read and write.
"""
