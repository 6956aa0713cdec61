"""Daily usage rows are never changed: on PostgreSQL a trigger refuses any UPDATE of
billing_dailyusage, whoever runs it (the model's save() refuses it too, on every database)."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION billing_usage_immutable() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'billing_dailyusage rows are immutable (docs/billing.md)';
END
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS billing_usage_no_update ON billing_dailyusage;
CREATE TRIGGER billing_usage_no_update BEFORE UPDATE ON billing_dailyusage
    FOR EACH ROW EXECUTE FUNCTION billing_usage_immutable();
"""
DROP = """
DROP TRIGGER IF EXISTS billing_usage_no_update ON billing_dailyusage;
DROP FUNCTION IF EXISTS billing_usage_immutable();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
