"""gunicorn settings of the web container: one process of threads, JSON logs like the rest of Stint.

One worker process per container, because prometheus_client counters live in process memory: with
several gunicorn workers each scrape of /metrics would read a different process's numbers. Scale
the web tier with more containers instead; ``GUNICORN_THREADS`` sets the threads per process.
"""

from __future__ import annotations

import os

bind = f"0.0.0.0:{os.environ.get('PORT', '8000')}"
worker_class = "gthread"
workers = 1
threads = int(os.environ.get("GUNICORN_THREADS", "8"))
timeout = 60  # seconds a request may take before the worker is restarted
graceful_timeout = 25  # seconds in-flight requests get after SIGTERM (compose allows 35)
keepalive = 5  # seconds
max_requests = 0  # never recycle the process: that would reset the counters
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
# One access line per request, with the id the request-id middleware echoed (X-Request-ID).
accesslog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms request_id=%({x-request-id}o)s'
errorlog = "-"
control_socket_disable = True  # the image's user has no home directory; nothing uses gunicornc
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(levelname)s %(name)s %(message)s",
            "rename_fields": {"levelname": "level", "name": "logger"},
            "timestamp": True,
        }
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
    "loggers": {
        "gunicorn.error": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "gunicorn.access": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
