// format.h — fmt's formatting, with fmt's implementation compiled once.
//
// The library uses fmt header-only (the shipped .so needs nothing beyond
// libc), and in that mode every translation unit that calls fmt::format
// compiles fmt's whole formatting engine again: about 7 s per file at -O2 -g,
// and three times that under the sanitizers.  obs::format checks the format
// string at compile time exactly as fmt::format does (fmt::format_string),
// then hands type-erased arguments to obs::vformat, which format.cpp
// compiles once.
#pragma once

#include <fmt/core.h>

#include <string>

namespace cachalloc::obs {

// fmt::vformat, compiled in format.cpp only (callers qualify the name:
// argument-dependent lookup would find fmt::vformat too).  Throws what fmt throws
// (fmt::format_error, std::bad_alloc), as fmt::format does.
std::string vformat(fmt::string_view format, fmt::format_args args);

// fmt::format(format, args...), with the formatting done by vformat above.
template <typename... T>
std::string format(fmt::format_string<T...> format, T&&... args) {
  return ::cachalloc::obs::vformat(format, fmt::make_format_args(args...));
}

}  // namespace cachalloc::obs
