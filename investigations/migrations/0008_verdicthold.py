import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("investigations", "0007_incident_actions"),
        ("tenants", "0003_operator_mask_node_names"),
    ]

    operations = [
        migrations.CreateModel(
            name="VerdictHold",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("reason", models.CharField(max_length=300)),
                ("held_since", models.DateTimeField()),
                (
                    "operator",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="tenants.operator",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("operator",), name="investigations_one_hold")
                ],
            },
        ),
    ]
