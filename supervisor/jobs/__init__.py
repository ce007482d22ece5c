"""The job lifecycle: admission, the live jobs (each one's run and conversation), recording, housekeeping, fencing."""
