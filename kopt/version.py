"""kopt's version (a module of its own, so that anything can read it without importing kopt)."""

__version__ = "0.1.0"
