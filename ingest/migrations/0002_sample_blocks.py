from django.db import migrations


def create(apps, schema_editor):
    from ingest.storage import create_block_table

    create_block_table(schema_editor.connection)


def drop(apps, schema_editor):
    from ingest.storage import drop_block_table

    drop_block_table(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("ingest", "0001_initial")]

    operations = [migrations.RunPython(create, drop)]
