"""Admin for users, with the role editable by operators."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin

from accounts.models import User


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    """Django's user admin plus the role."""

    list_display = ("username", "email", "role", "is_staff", "is_active", "date_joined")
    list_filter = ("role", "is_staff", "is_active")
    fieldsets = (*BaseUserAdmin.fieldsets, ("Stint", {"fields": ("role",)}))
    # Read-only: the form's split date and time inputs hold whole seconds, so saving a user wrote
    # both back without their microseconds, a change nobody made (and one the history could show).
    readonly_fields = ("last_login", "date_joined")
