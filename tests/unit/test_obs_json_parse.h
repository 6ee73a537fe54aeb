// test_obs_json_parse.h — a minimal JSON parser for the observability tests,
// so they read back what the writers wrote instead of grepping text.  Strict
// enough to reject malformed output (throws std::runtime_error); numbers keep
// their text so 64-bit integers compare exactly.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace obs_test {

struct Json {
  enum Kind { null, boolean, number, string, array, object } kind = null;
  bool b = false;
  std::string text;  // number text or string value
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;  // in document order

  bool has(const std::string& k) const {
    for (const auto& [key, v] : members)
      if (key == k) return true;
    return false;
  }
  const Json& operator[](const std::string& k) const {
    for (const auto& [key, v] : members)
      if (key == k) return v;
    throw std::runtime_error("no key " + k);
  }
  const Json& operator[](std::size_t i) const { return items.at(i); }
  std::int64_t i64() const { return std::stoll(text); }
  std::uint64_t u64() const { return std::stoull(text); }
  double f64() const { return std::stod(text); }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}
  Json parse() {
    Json v = value();
    ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what + " at " + std::to_string(i_)); }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    ws();
    if (i_ >= s_.size() || s_[i_] != c) fail(std::string("expected ") + c);
    ++i_;
  }
  bool literal(const char* word) {
    std::string w = word;
    if (s_.compare(i_, w.size(), w) != 0) return false;
    i_ += w.size();
    return true;
  }
  Json value() {
    ws();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    char c = s_[i_];
    if (c == '{') return object();
    if (c == '[') return array();
    if (c == '"') {
      v.kind = Json::string;
      v.text = str();
    } else if (literal("true")) {
      v.kind = Json::boolean;
      v.b = true;
    } else if (literal("false")) {
      v.kind = Json::boolean;
    } else if (literal("null")) {
      v.kind = Json::null;
    } else {
      v.kind = Json::number;
      std::size_t start = i_;
      while (i_ < s_.size() && std::string("+-0123456789.eE").find(s_[i_]) != std::string::npos) ++i_;
      if (start == i_) fail("bad value");
      v.text = s_.substr(start, i_ - start);
    }
    return v;
  }
  std::string str() {
    expect('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      char e = s_[i_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'u': {
          unsigned cp = std::stoul(s_.substr(i_, 4), nullptr, 16);
          i_ += 4;
          if (cp >= 0x80) fail("non-ASCII \\u escape not expected");
          out += static_cast<char>(cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }
  Json array() {
    expect('[');
    Json v;
    v.kind = Json::array;
    ws();
    if (s_[i_] == ']') {
      ++i_;
      return v;
    }
    while (true) {
      v.items.push_back(value());
      ws();
      if (s_[i_] == ']') {
        ++i_;
        return v;
      }
      expect(',');
    }
  }
  Json object() {
    expect('{');
    Json v;
    v.kind = Json::object;
    ws();
    if (s_[i_] == '}') {
      ++i_;
      return v;
    }
    while (true) {
      ws();
      std::string k = str();
      if (v.has(k)) fail("duplicate key " + k);
      expect(':');
      v.members.emplace_back(k, value());
      ws();
      if (s_[i_] == '}') {
        ++i_;
        return v;
      }
      expect(',');
    }
  }
  const std::string& s_;
  std::size_t i_ = 0;
};

inline Json parse_json(const std::string& s) { return JsonParser(s).parse(); }

}  // namespace obs_test
