"""Signals for metrics and alerts. Connect receivers as with any Django signal."""

from django.dispatch import Signal

# Sent when a held lock is found lost: its lease ran out before keep-alive could renew
# it, or it was cleared or taken over.
# Arguments: sender (the Lock class), lock (the Lock), reason (str).
lock_lost = Signal()
