from . import _Unavailable as Parser, _unavailable as pattern_for_opts  # noqa: F401
