"""Exercises: functions for you to complete. Each lab's check cell tests yours against minimega.

Set ``MINIMEGA_LAB_SOLUTIONS=1`` to point the check cells at ``labs/solutions/`` instead.
"""
