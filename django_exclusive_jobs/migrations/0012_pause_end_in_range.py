"""A pause's end out of the range a person may give (before 1970-01-01 or after
9000-01-01 UTC: ``values.EARLIEST``, ``values.LATEST``), written by an older version or by
SQL, is cleared: the pause is kept, until resumed (safer than ending it). Compared in SQL,
so no such value is ever fetched (on PostgreSQL the driver cannot read a BC or year-10000
timestamp). Nothing else is changed or recorded. The field reads through the same range
check from now on (``models.PauseEndField``): a row written later by SQL reads the same."""

import datetime as dt

from django.db import migrations
from django.db.models import Q

import django_exclusive_jobs.models

# As in values.py when this migration was written (a migration does not follow the code).
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)


def pause_ends_in_range(apps, schema_editor):
    JobState = apps.get_model("django_exclusive_jobs", "JobState")
    using = schema_editor.connection.alias
    out = Q(paused_until__lt=EARLIEST) | Q(paused_until__gt=LATEST)
    JobState.objects.using(using).filter(out).update(paused_until=None)


class Migration(migrations.Migration):

    dependencies = [
        ("django_exclusive_jobs", "0011_scheduler_free_capacity"),
    ]

    operations = [
        migrations.RunPython(pause_ends_in_range, migrations.RunPython.noop, elidable=True),
        migrations.AlterField(
            model_name="jobstate",
            name="paused_until",
            field=django_exclusive_jobs.models.PauseEndField(
                blank=True,
                help_text="The pause ends by itself then (database time); empty: until resumed.",
                null=True,
                verbose_name="paused until",
            ),
        ),
    ]
