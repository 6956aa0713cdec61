"""API token scopes read / read_write / admin, and a per-token request rate.

Before this migration an admin role's read_write token could use the admin endpoints; those
now need the admin scope, so existing read_write tokens of admin roles become admin tokens and
keep doing what they did."""

from typing import Any

from django.db import migrations, models

ADMIN_ROLES = ("operator_admin", "customer_admin")


def keep_admin_tokens_working(apps: Any, schema_editor: Any) -> None:
    ApiToken = apps.get_model("tenants", "ApiToken")
    if schema_editor.connection.vendor == "postgresql":
        # The table's row-level security applies to its owner too (FORCE): act as the system.
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT set_config('proof.system', 'on', true)")
    tokens = ApiToken.objects.using(schema_editor.connection.alias)
    tokens.filter(scope="read_write", role__in=ADMIN_ROLES).update(scope="admin")


def back_to_read_write(apps: Any, schema_editor: Any) -> None:
    ApiToken = apps.get_model("tenants", "ApiToken")
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT set_config('proof.system', 'on', true)")
    tokens = ApiToken.objects.using(schema_editor.connection.alias)
    tokens.filter(scope="admin").update(scope="read_write")


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0004_audit_event"),
    ]

    operations = [
        migrations.AlterField(
            model_name="apitoken",
            name="scope",
            field=models.CharField(
                choices=[
                    ("read", "Read only"),
                    ("read_write", "Read and write"),
                    ("admin", "Read, write and admin"),
                ],
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="rate_limit",
            field=models.CharField(blank=True, default="", max_length=32),
        ),
        migrations.RunPython(keep_admin_tokens_working, back_to_read_write),
    ]
