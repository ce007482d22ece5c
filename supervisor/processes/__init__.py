"""Process control: worker handles and their pipes, the launchers, the fork server, the reaper, the limits."""
