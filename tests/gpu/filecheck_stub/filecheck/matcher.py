from . import _Unavailable as Matcher, _Unavailable as Options  # noqa: F401
