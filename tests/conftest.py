"""Shared pytest fixtures. Each area keeps its fixtures in tests/_fixtures_<area>.py and is imported here."""
