"""The ``run_workers`` engine: a claim loop, a bounded pool of threads or processes, and batched outcome writes."""
