"""The jobs page's **Run now**: the confirmation page's arguments for the run.

GET shows what will happen and the arguments, prefilled with the job's declared
``kwargs`` (its schedule's, for ``NAME:schedule``); the POST (CSRF, change permission:
the jobs page's ``action_view`` checks both) asks for the run with them once they are
JSON and fit the job's function, checked as ``exclusive_jobs run NAME --kwargs`` checks
them (``Job.check_arguments``); else the page comes back with the error on the field
and nothing is asked for.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy

from ..lock.errors import LockConfigurationError
from ..run.arguments import parse_kwargs
from ..run.registry import Job


class RunNowForm(forms.Form):
    """The arguments of a run asked for now; valid once the job accepts them."""

    arguments = forms.CharField(
        label=gettext_lazy("Arguments"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60, "spellcheck": "false"}),
        help_text=gettext_lazy(
            "A JSON object of keyword arguments for this run. They update the job's "
            "declared arguments (shown here): a name given here wins; a name left out keeps "
            "its declared value."
        ),
    )

    def __init__(self, job: Job, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job = job
        self.fields["arguments"].initial = json.dumps(job.kwargs, ensure_ascii=False)

    def clean_arguments(self) -> dict[str, Any]:
        try:
            return self.job.check_arguments(parse_kwargs(self.cleaned_data["arguments"]))
        except LockConfigurationError as exc:
            raise ValidationError(str(exc)) from None
