"""Model-level helpers."""

from fla.models.utils import Cache

__all__ = ["Cache"]
