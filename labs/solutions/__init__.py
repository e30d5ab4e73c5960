"""Reference solutions to ``labs/exercises/``; the check cells use them when ``MINIMEGA_LAB_SOLUTIONS=1``."""
