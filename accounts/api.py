"""JWT auth endpoints: register, login, refresh, logout, me."""

from __future__ import annotations

from django.db import IntegrityError
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework_simplejwt.exceptions import TokenError
from rest_framework_simplejwt.tokens import RefreshToken
from rest_framework_simplejwt.views import TokenObtainPairView, TokenRefreshView

from accounts import services
from accounts.serializers import (
    LogoutSerializer,
    RegisterSerializer,
    TokenObtainPairSerializer,
    TokenRefreshSerializer,
    UserSerializer,
)


class RegisterView(APIView):
    """POST /api/auth/register: create a USER account."""

    permission_classes = [permissions.AllowAny]
    authentication_classes: list = []
    throttle_scope = "auth"

    @extend_schema(request=RegisterSerializer, responses={201: UserSerializer})
    def post(self, request: Request) -> Response:
        """Create the account; 400 on a taken username or a weak password."""
        body = RegisterSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            user = services.user_register(**body.validated_data)
        except IntegrityError as exc:
            raise serializers.ValidationError({"username": ["A user with that username already exists."]}) from exc
        return Response(UserSerializer(user).data, status=status.HTTP_201_CREATED)


class LoginView(TokenObtainPairView):
    """POST /api/auth/login: exchange username and password for ``access`` and ``refresh``."""

    serializer_class = TokenObtainPairSerializer
    throttle_scope = "auth"


class RefreshView(TokenRefreshView):
    """POST /api/auth/refresh: rotate the refresh token (the old one is blacklisted)."""

    serializer_class = TokenRefreshSerializer


class LogoutView(APIView):
    """POST /api/auth/logout: blacklist the caller's refresh token."""

    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(request=LogoutSerializer, responses={205: None})
    def post(self, request: Request) -> Response:
        """Blacklist ``refresh``; 400 if it is invalid or belongs to someone else."""
        body = LogoutSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            token = RefreshToken(body.validated_data["refresh"])
        except TokenError as exc:
            raise serializers.ValidationError({"refresh": [str(exc)]}) from exc
        if str(token.get("user_id")) != str(request.user.pk):
            raise serializers.ValidationError({"refresh": ["Token does not belong to this user."]})
        token.blacklist()
        return Response(status=status.HTTP_205_RESET_CONTENT)


class MeView(APIView):
    """GET /api/auth/me: the authenticated user."""

    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(responses=UserSerializer)
    def get(self, request: Request) -> Response:
        """Return the caller's account."""
        return Response(UserSerializer(request.user).data)
