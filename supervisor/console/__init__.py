"""The operator CLI: its commands, the HTTP client, the views, and the one SSE parser."""
