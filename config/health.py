"""GET /api/health: whether PostgreSQL, Redis and Kafka answer."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.conf import settings
from django.db import connection
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

logger = logging.getLogger(__name__)

KAFKA_TIMEOUT = 2.0  # seconds

_admin_lock = threading.Lock()
_admin_client: Any = None


def database_up() -> bool:
    """Return True when ``SELECT 1`` succeeds on the default database."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception:  # any driver error means down
        logger.warning("health: database down", exc_info=True)
        return False
    return True


def redis_up() -> bool:
    """Return True when Redis answers PING within the cache's socket timeout."""
    from django_redis import get_redis_connection

    try:
        return bool(get_redis_connection("default").ping())
    except Exception:  # any client error means down
        return False


def kafka_up() -> bool:
    """Return True when the Kafka bootstrap servers return cluster metadata within 2 s."""
    global _admin_client
    from confluent_kafka.admin import AdminClient

    with _admin_lock:
        if _admin_client is None:
            _admin_client = AdminClient({"bootstrap.servers": settings.KAFKA_BOOTSTRAP_SERVERS, "log_level": 0})
        client = _admin_client
    try:
        client.list_topics(timeout=KAFKA_TIMEOUT)
    except Exception:  # KafkaException on timeout or refusal
        return False
    return True


class HealthView(APIView):
    """Report each component as "up" or "down"; 200 while the database is up, else 503."""

    permission_classes = [permissions.AllowAny]
    authentication_classes: list = []
    throttle_classes: list = []

    @extend_schema(
        responses={
            200: inline_serializer(
                "Health",
                {
                    "status": serializers.CharField(),
                    "components": serializers.DictField(child=serializers.CharField()),
                },
            )
        }
    )
    def get(self, request: Request) -> Response:
        """Probe the three components."""
        components = {
            "database": "up" if database_up() else "down",
            "redis": "up" if redis_up() else "down",
            "kafka": "up" if kafka_up() else "down",
        }
        ok = components["database"] == "up"
        overall = "ok" if all(v == "up" for v in components.values()) else ("degraded" if ok else "down")
        return Response({"status": overall, "components": components}, status=200 if ok else 503)
