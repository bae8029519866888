"""Read-only admin views of adapter versions and training rounds.

Decisions go through the approval gate (``/adapters/``, ``services``), never through the
admin, so nothing here can add, change or delete a row.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from webapp.learning.models import AdapterVersion, LearningScope, SimulationRun, TrainingRun


class ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AdapterVersion)
class AdapterVersionAdmin(ReadOnly):
    list_display = ("name", "status", "parent", "created_at", "approved_by", "activated_at")
    list_filter = ("status",)
    search_fields = ("name", "sha256")


@admin.register(TrainingRun)
class TrainingRunAdmin(ReadOnly):
    list_display = ("pk", "status", "phase", "trigger", "attempts", "group_count", "edge_count",
                    "output_version", "created_at")  # fmt: skip
    list_filter = ("status", "trigger")


@admin.register(LearningScope)
class LearningScopeAdmin(ReadOnly):
    list_display = ("name", "completed_sessions", "sessions_per_round")


@admin.register(SimulationRun)
class SimulationRunAdmin(ReadOnly):
    list_display = ("pk", "status", "strategy", "adapter", "curriculum", "ablation", "created_at")
    list_filter = ("status", "strategy")
