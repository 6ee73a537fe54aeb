// json_writer.h — a tiny streaming JSON writer (no dependency, no DOM).
//
// Builds compact JSON into a std::string.  The writer tracks whether a comma
// is due, so callers just say what comes next:
//   JsonWriter w; w.begin_object(); w.key("pid"); w.value(42); w.end_object();
// Strings are escaped per RFC 8259 (quote, backslash, control characters as
// \uXXXX); bytes >= 0x80 pass through (UTF-8 in, UTF-8 out).  Non-finite
// doubles are written as null, since JSON has no NaN.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cachalloc::obs {

class JsonWriter {
 public:
  void begin_object();
  void end_object();
  void begin_array();
  void end_array();
  void key(std::string_view k);

  void value(std::string_view s);
  void value(const char* s) { value(std::string_view(s)); }
  void value(std::int64_t v);
  void value(std::uint64_t v);
  void value(int v) { value(static_cast<std::int64_t>(v)); }
  void value(double v);
  void value(bool v);
  void null();
  // A number already formatted (e.g. fixed-point timestamps); not checked.
  void number_text(std::string_view text);

  // key + value in one call.
  template <typename T>
  void field(std::string_view k, const T& v) {
    key(k);
    value(v);
  }

  const std::string& str() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void before_value();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

// `s` as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);

}  // namespace cachalloc::obs
