"""The quarantine's retention, and how the console shows it."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from audit.models import QuarantinedMessage, QuarantineReason
from audit.quarantine import QuarantineEntry, QuarantinePruner, quarantine_store
from audit.selectors import trail_health
from scheduler.admin_dashboard import db_now
from scheduler.maintenance.reconciler import STATE_NAME
from scheduler.models import OutboxReconcile

pytestmark = pytest.mark.django_db

T = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


def quarantined(offset: int, *, received_at: dt.datetime, value: bytes = b"not json", **fields) -> QuarantinedMessage:
    quarantine_store(
        entries=[
            QuarantineEntry(
                topic="job-lifecycle-events",
                partition=2,
                offset=offset,
                key=b"k",
                value=value,
                reason=fields.pop("reason", QuarantineReason.MALFORMED),
                error=fields.pop("error", "not JSON: Expecting value"),
                **fields,
            )
        ]
    )
    QuarantinedMessage.objects.filter(offset=offset).update(received_at=received_at)
    return QuarantinedMessage.objects.get(offset=offset)


def test_the_pruner_deletes_what_is_older_than_the_retention_in_bounded_batches():
    old = [quarantined(i, received_at=T - 31 * DAY) for i in range(5)]
    recent = quarantined(10, received_at=T - 29 * DAY)

    assert QuarantinePruner(retention=30 * DAY, batch_size=2).run_once(now=T) == 5

    assert list(QuarantinedMessage.objects.values_list("id", flat=True)) == [recent.id]
    assert not QuarantinedMessage.objects.filter(id__in=[m.id for m in old]).exists()


def test_a_retention_of_zero_keeps_everything():
    quarantined(1, received_at=T - 400 * DAY)

    assert QuarantinePruner(retention=dt.timedelta(0)).run_once(now=T) == 0
    assert QuarantinedMessage.objects.count() == 1


def test_the_default_retention_is_the_setting(settings):
    settings.AUDIT_QUARANTINE_RETENTION_DAYS = 3

    assert QuarantinePruner().retention == 3 * DAY


@pytest.fixture
def operator(client, admin_user):
    client.force_login(admin_user)
    return client


def test_the_console_lists_quarantined_messages_with_their_bytes_and_error(operator):
    job_id = uuid.uuid4()
    message = quarantined(
        7,
        received_at=T,
        value=b'{"payload": {"n": 1e400}}\x00\xff<script>',
        reason=QuarantineReason.REFUSED,
        error="DataError (22P02): invalid input syntax for type json",
        job_id=job_id,
        event_id=uuid.uuid4(),
    )
    quarantined(8, received_at=T, value=b"other", error="not JSON: something else")

    listing = operator.get("/admin/audit/quarantinedmessage/")
    detail = operator.get(f"/admin/audit/quarantinedmessage/{message.id}/change/")
    by_job = operator.get("/admin/audit/quarantinedmessage/", {"q": str(job_id)})
    by_error = operator.get("/admin/audit/quarantinedmessage/", {"q": "something else"})

    assert listing.status_code == detail.status_code == 200
    page = listing.content.decode()
    assert "job-lifecycle-events[2]@7" in page and "refused by the database" in page
    text = detail.content.decode()
    assert "1e400" in text and "\\x00\\xff&lt;script&gt;" in text  # bytes shown escaped, never raw HTML
    assert "invalid input syntax for type json" in text
    assert "job-lifecycle-events[2]@7" in by_job.content.decode()
    assert "[2]@8" not in by_job.content.decode()
    assert "[2]@8" in by_error.content.decode() and "[2]@7" not in by_error.content.decode()


@pytest.mark.parametrize("query", ["key__exact=abc", "value__gte=x", "value__in=a,b", "key__startswith=%FF"])
def test_a_filter_on_the_raw_bytes_is_the_bad_filter_page_not_a_500(operator, query):
    quarantined(1, received_at=db_now())

    response = operator.get(f"/admin/audit/quarantinedmessage/?{query}")

    assert response.status_code == 302
    assert response["Location"] == "/admin/audit/quarantinedmessage/?e=1"  # Django's answer to an invalid lookup


def test_the_raw_bytes_may_still_be_filtered_on_being_there(operator):
    quarantined(1, received_at=db_now())

    assert operator.get("/admin/audit/quarantinedmessage/?key__isnull=True").status_code == 200


def test_the_console_has_no_way_to_edit_or_delete_a_quarantined_message(operator):
    message = quarantined(3, received_at=T)

    assert operator.post(f"/admin/audit/quarantinedmessage/{message.id}/delete/").status_code == 403
    assert operator.get("/admin/audit/quarantinedmessage/add/").status_code == 403


def test_the_dashboard_shows_the_trail_health(operator):
    quarantined(1, received_at=T)
    OutboxReconcile.objects.create(name=STATE_NAME, repaired_total=4, last_run_at=T, last_repair_at=T)

    trail = trail_health(now=db_now())
    page = operator.get("/admin/").content.decode()

    assert (trail.quarantined, trail.repaired_total) == (1, 4)
    assert 'id="stint-trail"' in page
    assert '<span data-count-for="quarantined">1</span> quarantined' in page
    assert '<span data-count-for="repaired">4</span> events re-published' in page
