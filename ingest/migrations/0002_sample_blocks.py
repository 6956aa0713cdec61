from django.db import migrations

from ingest.storage import create_block_table, drop_block_table


def create(apps, schema_editor):
    create_block_table(schema_editor.connection)


def drop(apps, schema_editor):
    drop_block_table(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("ingest", "0001_initial")]

    operations = [migrations.RunPython(create, drop)]
