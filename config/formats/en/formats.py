"""English formats: ISO-like dates and times with seconds, instead of Django's "Nov. 30, 2026, 2:28 p.m.".

An operator compares times across jobs, attempts and events that are seconds apart: every
datetime the console and the pages print has seconds, as the API's ISO 8601 has.
"""

DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
DATETIME_FORMAT = "Y-m-d H:i:s"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
