from . import _Unavailable as FInput  # noqa: F401
