from . import _Unavailable as Options, _unavailable as parse_argv_options  # noqa: F401
from . import _Unavailable as DumpInputKind  # noqa: F401
