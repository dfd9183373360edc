"""SME2 device farm: the namespace that the repository's top-level folders install under."""

__version__ = "0.1.0"
