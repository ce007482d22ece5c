"""What the journal raises: every caller catches these from here (HTTP maps them to 503 and 507)."""


class JournalError(Exception):
    """The journal cannot be used or could not make a write durable."""


class JournalBusy(JournalError):
    """Another process held the journal's write lock for longer than the write could wait."""


class JournalLocked(JournalError):
    """Another supervisor holds the journal's lock."""
