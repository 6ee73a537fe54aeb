// fuzz_path_template.cpp — the %-placeholders of the stats/snapshot/trace
// paths (core/obs/path_template.h).
//
// The input is a template of arbitrary text and the values of %h (host)
// and %r (rank), which come from outside the program (gethostname, the
// RANK-like environment variables) and may hold anything but NUL; %p is a
// process id and %d a date, as in a real process.  Properties:
//  * no crash, no leak, no hang;
//  * the file goes where the template says: a substituted value never adds
//    a '/' (the output has exactly the path components of the template),
//    and never makes a whole component "." or ".." that the template did
//    not spell out itself;
//  * a template without '%' comes back unchanged, and with values made of
//    ordinary file-name characters the expansion is exactly the documented
//    one (%p %h %r %d %% substituted, any other "%x" and a trailing '%'
//    kept as written).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "path_template.h"

using cachalloc::obs::expand_path_template;
using cachalloc::obs::TemplateContext;

namespace {

std::string no_nul(std::string s) {
  for (char& c : s)
    if (c == '\0') c = '_';
  return s;
}

// A value of 1..32 characters; `tame` keeps to [A-Za-z0-9._-] and avoids
// values made only of dots.
std::string pick_value(FuzzedDataProvider& in, bool tame) {
  std::string v = no_nul(in.ConsumeRandomLengthString(32));
  if (v.empty()) v = "x";
  if (tame) {
    static const char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
    for (char& c : v) c = kAlphabet[static_cast<unsigned char>(c) % (sizeof kAlphabet - 1)];
    if (v.find_first_not_of('.') == std::string::npos) v[0] = 'd';
  }
  return v;
}

// The documented expansion, with each output character marked as coming
// from the template's own text (false) or from a substituted value (true).
struct Expanded {
  std::string text;
  std::vector<bool> substituted;
  void add(char c, bool sub) {
    text += c;
    substituted.push_back(sub);
  }
  void add(const std::string& s) {
    for (char c : s) add(c, true);
  }
};

Expanded reference(const std::string& t, const TemplateContext& ctx) {
  Expanded out;
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (t[i] != '%' || i + 1 == t.size()) {
      out.add(t[i], false);
      continue;
    }
    const char c = t[++i];
    if (c == 'p') out.add(ctx.pid);
    else if (c == 'h') out.add(ctx.host);
    else if (c == 'r') out.add(ctx.rank);
    else if (c == 'd') out.add(ctx.datetime);
    else if (c == '%') out.add('%', false);
    else {
      out.add('%', false);
      out.add(c, false);
    }
  }
  return out;
}

std::vector<std::string> components(const std::string& path) {
  std::vector<std::string> parts(1);
  for (char c : path) {
    if (c == '/') parts.emplace_back();
    else parts.back() += c;
  }
  return parts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const bool tame = in.ConsumeBool();
  TemplateContext ctx;
  ctx.pid = std::to_string(in.ConsumeIntegralInRange<std::uint32_t>(1, 4194304));
  ctx.host = pick_value(in, tame);
  ctx.rank = pick_value(in, tame);
  ctx.datetime = "20260102-030405";
  const std::string tmpl = in.ConsumeRemainingBytesAsString();

  const std::string out = expand_path_template(tmpl, ctx);
  const Expanded ref = reference(tmpl, ctx);

  if (tmpl.find('%') == std::string::npos) FUZZ_CHECK(out == tmpl);
  if (tame) FUZZ_CHECK(out == ref.text);

  // The template's own components, with whether a value lands in each.
  std::vector<std::string> tmpl_parts(1);
  std::vector<bool> has_value(1, false);
  for (std::size_t i = 0; i < ref.text.size(); ++i) {
    if (ref.text[i] == '/' && !ref.substituted[i]) {
      tmpl_parts.emplace_back();
      has_value.push_back(false);
      continue;
    }
    tmpl_parts.back() += ref.text[i];
    if (ref.substituted[i]) has_value.back() = true;
  }
  const std::vector<std::string> out_parts = components(out);
  FUZZ_CHECK(out_parts.size() == tmpl_parts.size());  // no '/' from a value
  for (std::size_t i = 0; i < out_parts.size(); ++i) {
    if (!has_value[i]) {
      FUZZ_CHECK(out_parts[i] == tmpl_parts[i]);  // the template's own text, unchanged
    } else {
      FUZZ_CHECK(out_parts[i] != "." && out_parts[i] != "..");
      FUZZ_CHECK(!out_parts[i].empty());
    }
  }
  return 0;
}
