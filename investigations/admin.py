"""Staff admin for the live pipeline's rows (system_context via tenants' middleware)."""

from __future__ import annotations

from django.contrib import admin

from investigations.models import GpuListPrice, Incident, VerdictRevision


@admin.register(GpuListPrice)
class GpuListPriceAdmin(admin.ModelAdmin[GpuListPrice]):
    list_display = ["operator", "gpu_model", "price_per_gpu_hour", "currency", "updated_at"]
    list_filter = ["operator", "currency"]
    search_fields = ["gpu_model"]


class VerdictRevisionInline(admin.TabularInline[VerdictRevision, Incident]):
    model = VerdictRevision
    extra = 0
    can_delete = False
    fields = ("number", "kind", "family", "category", "confidence", "created_at")
    readonly_fields = fields


@admin.register(Incident)
class IncidentAdmin(admin.ModelAdmin[Incident]):
    list_display = ["public_id", "operator", "family", "category", "confidence", "state", "job"]
    list_filter = ["state", "family", "category", "operator"]
    search_fields = ["public_id", "job__job_id", "subject_gpu", "subject_node"]
    readonly_fields = [f.name for f in Incident._meta.fields]
    inlines = [VerdictRevisionInline]

    def has_add_permission(self, request: object) -> bool:
        return False
