"""The jobs REST API: thin DRF views over ``scheduler.services`` and ``scheduler.selectors``."""
