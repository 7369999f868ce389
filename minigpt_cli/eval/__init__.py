"""Measuring a trained run: :mod:`.evaluate` is the ``evaluate`` command as a function."""
