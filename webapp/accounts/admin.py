from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from webapp.accounts.models import ClientProfile, ConsentRecord, User


@admin.register(User)
class PsyEvoUserAdmin(UserAdmin):
    list_display = ("username", "role", "is_active", "last_login", "date_joined")
    list_filter = ("role", "is_active")
    fieldsets = (*UserAdmin.fieldsets, ("PsyEvo", {"fields": ("role",)}))  # type: ignore[misc]
    add_fieldsets = (*UserAdmin.add_fieldsets, ("PsyEvo", {"fields": ("role",)}))

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        # Deleting a user here would drop a client's data with no erasure report or
        # tombstone: erase from the console (/console/), deactivate accounts here.
        return False


class ConsentInline(admin.TabularInline):
    model = ConsentRecord
    extra = 0
    readonly_fields = ("purpose", "granted", "recorded_at", "recorded_by")
    can_delete = False

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False  # consent is the client's to give, recorded from their own page


@admin.register(ClientProfile)
class ClientProfileAdmin(admin.ModelAdmin):
    list_display = ("user", "modality", "clinician", "created_at")
    list_filter = ("modality", "clinician")
    search_fields = ("user__username",)
    inlines = [ConsentInline]
