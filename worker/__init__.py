"""The child side: one process per job. Imports crewai and the crew registry; knows nothing of HTTP."""
