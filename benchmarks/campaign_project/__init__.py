"""A small Django project for ``benchmarks/campaign.py``: settings, a few jobs, their history.

Nothing here is part of the app. ``jobs.py`` registers the campaign's jobs (``camp_a``
every second, ``camp_b`` and ``camp_c`` every two); each appends its ``start``,
``fenced_write`` and ``end`` events to ``$CAMPAIGN_HISTORY`` (see
``benchmarks/history_check.py`` for what they hold).
"""
