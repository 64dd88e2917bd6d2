"""The one exception of the KServe deploy: a one-line reason, safe to show (it never holds a credential)."""

from __future__ import annotations


class KServeError(Exception):
    """One-line reason the model could not be published or served by KServe."""
