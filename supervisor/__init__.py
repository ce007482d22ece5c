"""The parent side: HTTP API, job lifecycle, process control and the journal. Never imports crewai."""
