"""``manage.py example_tasks``: enqueue one call of each example task and print the result ids."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from examples import tasks


class Command(BaseCommand):
    """Thin: enqueue through Django's Tasks API, print each ``TaskResult`` id."""

    help = "Enqueue one call of each example task (they run on the Stint workers)."

    def handle(self, *args: Any, **options: Any) -> None:
        """Enqueue and print."""
        for name, result in [
            ("add", tasks.add.enqueue(2, 3)),
            ("greet", tasks.greet.enqueue("Ada")),
            ("flaky_report", tasks.flaky_report.enqueue(fail_attempts=1)),
            ("always_fails", tasks.always_fails.enqueue()),
        ]:
            self.stdout.write(f"{name}: {result.id} {result.status}")
