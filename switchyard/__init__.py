"""Switchyard: route work to the right worker, at the right time, without losing it."""

__version__ = "0.1.0"
