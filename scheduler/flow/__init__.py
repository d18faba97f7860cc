"""Flow control: global concurrency and rate limits, unique jobs, progress, aging (issue 17).

Each capability lives in its own module here; the hot path (``scheduler.leasing``,
``scheduler.enqueuing``) calls into this package at one delimited point each.
"""
