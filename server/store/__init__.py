"""Storage: the SQL engine and sessions, the tables, and the artifact files on disk."""
