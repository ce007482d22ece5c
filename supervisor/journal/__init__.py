"""The durable journal: the SQLite store, its schema and migrations, private state files."""
