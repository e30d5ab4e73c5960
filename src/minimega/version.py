"""The package version, recorded in every checkpoint manifest."""
__version__ = "0.1.0"
