"""Flow-limit endpoints (ADMIN): read, set and remove the concurrency and rate limits of queues and job types.

- GET /api/admin/limits: every effective limit (handlers', settings', the database's) with its use now;
- GET, PUT, DELETE /api/admin/queues/{name}/limits and /api/admin/types/{name}/limits.

Thin views over ``scheduler.flow.limits``; a PUT replaces the database's limit on that name
(it wins over a handler's or the settings'), a DELETE removes it. Workers apply a change
within about a second.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import permissions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.openapi import ERROR_REF
from core.query_params import check_known
from scheduler import selectors
from scheduler.api.views import IsAdminRole
from scheduler.exceptions import JobNotFound
from scheduler.flow import limits as flow_limits
from scheduler.flow.explain import limit_usage

NAME_PARAM = OpenApiParameter(
    "name", OpenApiTypes.STR, OpenApiParameter.PATH, description="1-100 of: letters, digits, '_', '.', ':', '-'."
)


_COUNT = {"min_value": 1, "max_value": flow_limits.MAX_LIMIT, "allow_null": True, "required": False}


class LimitWriteSerializer(serializers.Serializer):
    """Body of PUT .../limits (documentation only: ``flow.limits.validated`` is the one validator)."""

    concurrency = serializers.IntegerField(**_COUNT)
    partition_key = serializers.CharField(max_length=100, allow_null=True, required=False)
    partition_concurrency = serializers.IntegerField(**_COUNT)
    rate_limit = serializers.IntegerField(**_COUNT)
    rate_period_seconds = serializers.FloatField(
        min_value=flow_limits.MIN_PERIOD_SECONDS,
        max_value=flow_limits.MAX_PERIOD_SECONDS,
        allow_null=True,
        required=False,
    )


class FlowLimitSerializer(serializers.Serializer):
    """A limit in effect as read, with what it counts now (documentation of the read shape)."""

    key = serializers.CharField()
    scope = serializers.ChoiceField(choices=["queue", "type"])
    name = serializers.CharField()
    concurrency = serializers.IntegerField(allow_null=True)
    partition_key = serializers.CharField(allow_null=True)
    partition_concurrency = serializers.IntegerField(allow_null=True)
    rate_limit = serializers.IntegerField(allow_null=True)
    rate_period_seconds = serializers.FloatField(allow_null=True)
    source = serializers.ChoiceField(choices=["handler", "settings", "database"])
    running = serializers.IntegerField(help_text="RUNNING jobs it counts now.")
    admitted_in_window = serializers.IntegerField(
        allow_null=True, help_text="Claims in the current rate window (null without a rate limit)."
    )
    in_use = serializers.BooleanField(
        help_text="False when no job (of any status), schedule, live worker, handler or task uses the name (a "
        "typo never matches); a pause or limit is no use."
    )
    warning = serializers.CharField(allow_null=True, help_text="Why ``in_use`` is false, or null.")


LIMIT_READ = FlowLimitSerializer


def _read(limit: flow_limits.Limit, *, in_use: bool | None = None) -> dict[str, Any]:
    use = selectors.flow_name_use(scope=limit.scope, name=limit.name, in_use=in_use)
    return {**limit.as_dict(), **limit_usage(limit), **use}


class LimitListView(APIView):
    """GET /api/admin/limits (ADMIN)."""

    permission_classes = [permissions.IsAuthenticated, IsAdminRole]

    @extend_schema(
        operation_id="admin_limits_list",
        summary="List the flow limits in effect (ADMIN)",
        description="Every concurrency and rate limit in effect, from handlers, settings and the database "
        "(the database wins for the same queue or type), with how many jobs each counts now.",
        tags=["admin"],
        responses={200: LIMIT_READ(many=True), 403: OpenApiResponse(ERROR_REF, description="Not an ADMIN.")},
    )
    def get(self, request: Request) -> Response:
        """Return the effective limits, by key; 400 for a query parameter (it takes none)."""
        check_known(request, self, paging=())
        limits = flow_limits.effective_limits(fresh=True)
        used = selectors.flow_names_in_use(names=[(lim.scope, lim.name) for lim in limits.values()])
        return Response([_read(limits[k], in_use=(limits[k].scope, limits[k].name) in used) for k in sorted(limits)])


class _LimitDetailView(APIView):
    permission_classes = [permissions.IsAuthenticated, IsAdminRole]
    scope = ""

    def get(self, request: Request, name: str) -> Response:
        """Return the limit in effect on this name; 404 when there is none; 400 for a query parameter."""
        check_known(request, self, paging=())
        flow_limits.validated({"concurrency": 1}, scope=self.scope, name=name)  # 400 for a bad name
        limit = flow_limits.effective_limits(fresh=True).get(f"{self.scope}:{name}")
        if limit is None:
            raise JobNotFound(f"No limit on {self.scope} {name}.")
        return Response(_read(limit))

    def put(self, request: Request, name: str) -> Response:
        """Set (create or replace) the database limit on this name and return the limit now in effect."""
        limit = flow_limits.limit_set(scope=self.scope, name=name, data=request.data, actor=request.user)
        return Response(_read(limit))

    def delete(self, request: Request, name: str) -> Response:
        """Remove the database limit on this name: 204, or 404 when there was none."""
        if not flow_limits.limit_delete(scope=self.scope, name=name, actor=request.user):
            raise JobNotFound(f"No database limit on {self.scope} {name}.")
        return Response(status=status.HTTP_204_NO_CONTENT)


def _detail_schema(scope: str) -> dict[str, Any]:
    errors = {
        400: OpenApiResponse(ERROR_REF, description="Not a valid name or limit."),
        403: OpenApiResponse(ERROR_REF, description="Not an ADMIN."),
        404: OpenApiResponse(ERROR_REF, description="No such limit."),
    }
    return {
        "get": extend_schema(
            operation_id=f"admin_{scope}_limits_read",
            summary=f"Read the flow limit of a {scope} (ADMIN)",
            tags=["admin"],
            parameters=[NAME_PARAM],
            responses={200: LIMIT_READ, **errors},
        ),
        "put": extend_schema(
            operation_id=f"admin_{scope}_limits_set",
            summary=f"Set the flow limit of a {scope} (ADMIN)",
            description="Replaces the database's limit on this name. Set at least one of `concurrency` (RUNNING "
            "at once across all workers), `partition_key` with `partition_concurrency` (RUNNING at once per "
            "distinct value of that payload field, default 1), `rate_limit` with `rate_period_seconds` (claims "
            "in any sliding window). Unknown fields are a 400. Workers apply it within about a second.",
            tags=["admin"],
            parameters=[NAME_PARAM],
            request=LimitWriteSerializer,
            responses={200: LIMIT_READ, 400: errors[400], 403: errors[403]},
        ),
        "delete": extend_schema(
            operation_id=f"admin_{scope}_limits_delete",
            summary=f"Remove the database flow limit of a {scope} (ADMIN)",
            description="A handler's or the settings' limit on the same name applies again.",
            tags=["admin"],
            parameters=[NAME_PARAM],
            responses={204: None, **errors},
        ),
    }


def _decorate(cls: type[_LimitDetailView]) -> type[_LimitDetailView]:
    # A function of its own per class and method: extend_schema annotates the function it wraps.
    for method, schema in _detail_schema(cls.scope).items():
        base = getattr(_LimitDetailView, method)

        def own(self: _LimitDetailView, request: Request, name: str, _base: Any = base) -> Response:
            return _base(self, request, name)

        own.__name__, own.__doc__ = base.__name__, base.__doc__
        setattr(cls, method, schema(own))
    return cls


@_decorate
class QueueLimitView(_LimitDetailView):
    """GET, PUT, DELETE /api/admin/queues/{name}/limits (ADMIN)."""

    scope = "queue"


@_decorate
class TypeLimitView(_LimitDetailView):
    """GET, PUT, DELETE /api/admin/types/{name}/limits (ADMIN)."""

    scope = "type"
