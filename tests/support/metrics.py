"""Reading a real process's ``/metrics`` the way Prometheus does (prometheus_client's own parser)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape_text(port: int) -> str:
    """GET http://127.0.0.1:port/metrics and return the exposition text; URLError when nothing answers."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:  # noqa: S310 - loopback
        return response.read().decode()


def scrape(port: int) -> Samples:
    """GET http://127.0.0.1:port/metrics and return {(sample name, frozenset of labels): value}."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(scrape_text(port))
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of one sample, or None when the process does not export it."""
    return samples.get((name, frozenset(labels.items())))
