// format.cpp — see format.h: the one translation unit that compiles fmt's
// formatting engine for the library's own formatting.
#include "format.h"

#include <fmt/format.h>

namespace cachalloc::obs {

std::string vformat(fmt::string_view format, fmt::format_args args) { return fmt::vformat(format, args); }

}  // namespace cachalloc::obs
