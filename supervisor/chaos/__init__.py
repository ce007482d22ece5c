"""``crew-supervisor chaos``: faults under load, the rules for answers, the invariants after restarts."""
