# Scheduling policy: one row per attempt (retries), timed-out runs, slots skipped by the
# overlap policy, and a run's arguments.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_exclusive_jobs", "0006_first_seen_acknowledged_cancelled"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="jobrun",
            name="exclusive_jobs_one_run_per_slot",
        ),
        migrations.RenameField(
            model_name="jobrun",
            old_name="attempts",
            new_name="attempt",
        ),
        migrations.AlterField(
            model_name="jobrun",
            name="attempt",
            field=models.PositiveIntegerField(
                default=1,
                help_text="1 for a slot's first run; each retry of a failed slot is a run of its own.",
                verbose_name="attempt",
            ),
        ),
        migrations.AddField(
            model_name="jobrun",
            name="retry_at",
            field=models.DateTimeField(
                blank=True,
                null=True,
                help_text="Set on a failed attempt that will be retried: the earliest time (database time) the next attempt may start. Empty on a slot's last attempt.",
                verbose_name="retry at",
            ),
        ),
        migrations.AddField(
            model_name="jobrun",
            name="kwargs",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="The keyword arguments the job's function was called with.",
                verbose_name="arguments",
            ),
        ),
        migrations.AlterField(
            model_name="jobrun",
            name="status",
            field=models.CharField(
                choices=[
                    ("running", "running"),
                    ("succeeded", "succeeded"),
                    ("failed", "failed"),
                    ("interrupted", "interrupted"),
                    ("lost", "lost"),
                    ("missed", "missed"),
                    ("enqueued", "enqueued"),
                    ("timed_out", "timed out"),
                    ("skipped", "skipped"),
                ],
                default="running",
                max_length=16,
                verbose_name="status",
            ),
        ),
        migrations.AddConstraint(
            model_name="jobrun",
            constraint=models.UniqueConstraint(
                fields=("name", "slot", "attempt"), name="exclusive_jobs_one_run_per_attempt"
            ),
        ),
    ]
