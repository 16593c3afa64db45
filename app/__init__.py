"""Parley: conversation sessions for Claude agents."""

__version__ = "0.1.0"
