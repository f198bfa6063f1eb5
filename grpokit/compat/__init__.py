"""Compatibility with other tools' conventions."""
