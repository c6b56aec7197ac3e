# Scheduling policy: one row per attempt (retries), timed-out runs, slots skipped and
# runs cancelled by the overlap policy, backfills, and a run's arguments.

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
        migrations.AddField(
            model_name="jobrun",
            name="backfill",
            field=models.BooleanField(
                default=False,
                help_text="Run by a backfill of past slots; requested_by says who asked.",
                verbose_name="backfilled",
            ),
        ),
        migrations.AddField(
            model_name="runrequest",
            name="slot",
            field=models.DateTimeField(
                blank=True, help_text="A backfill: the past slot to run.", null=True, verbose_name="slot"
            ),
        ),
        migrations.AddField(
            model_name="runrequest",
            name="stop_token",
            field=models.BigIntegerField(
                blank=True,
                help_text='A stop: the token of the run to stop, so that a newer slot can run (overlap="cancel_other").',
                null=True,
                verbose_name="stop token",
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
                    ("cancelled", "cancelled"),
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
