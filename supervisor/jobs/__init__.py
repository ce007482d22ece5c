"""The job lifecycle: admission, the runner, the recorder, housekeeping, how jobs end, restart fencing."""
