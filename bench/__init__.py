"""Benchmarks (`make loadtest`, `make bench`); also a Django app holding the load-test handler."""
