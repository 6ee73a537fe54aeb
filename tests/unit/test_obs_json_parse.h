// test_obs_json_parse.h — JSON for the observability tests, so they read back
// what the writers wrote instead of grepping text.  Parsed by nlohmann-json
// (Debian's nlohmann-json3-dev, header-only, tests only: the shipped library
// has no dependency), strict: malformed output throws std::runtime_error.
// The tests' view of a value is kept (kind, text, items, members in document
// order): numbers keep their text so 64-bit integers compare exactly and a
// float's formatting can be checked.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
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

// Builds a Json from nlohmann's SAX events: the members in document order,
// and a float's text exactly as written (the tests check the writers'
// formatting, "0.000"); an integer's text is its value, which is exact.
class JsonBuilder final : public nlohmann::json_sax<nlohmann::json> {
 public:
  Json take() { return std::move(root_); }

  bool null() override { return put(Json{}); }
  bool boolean(bool v) override {
    Json j;
    j.kind = Json::boolean;
    j.b = v;
    return put(std::move(j));
  }
  bool number_integer(number_integer_t v) override { return put(number(std::to_string(v))); }
  bool number_unsigned(number_unsigned_t v) override { return put(number(std::to_string(v))); }
  bool number_float(number_float_t, const string_t& text) override { return put(number(text)); }
  bool string(string_t& v) override {
    Json j;
    j.kind = Json::string;
    j.text = v;
    return put(std::move(j));
  }
  bool binary(binary_t&) override { return false; }  // not JSON text
  bool start_object(std::size_t) override { return open(Json::object); }
  bool key(string_t& k) override {
    key_ = k;
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(Json::array); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw std::runtime_error(std::string("invalid JSON: ") + e.what());
  }

 private:
  static Json number(std::string text) {
    Json j;
    j.kind = Json::number;
    j.text = std::move(text);
    return j;
  }
  // Places a value in the open container (or as the root); returns where.
  Json* place(Json v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& parent = *open_.back();
    if (parent.kind == Json::array) {
      parent.items.push_back(std::move(v));
      return &parent.items.back();
    }
    parent.members.emplace_back(key_, std::move(v));
    return &parent.members.back().second;
  }
  bool put(Json v) {
    place(std::move(v));
    return true;
  }
  bool open(Json::Kind kind) {
    Json j;
    j.kind = kind;
    // Valid until it closes: its parent gets no other child meanwhile, so the
    // vector holding it does not grow.
    open_.push_back(place(std::move(j)));
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  Json root_;
  std::vector<Json*> open_;
  std::string key_;
};

inline Json parse_json(const std::string& s) {
  JsonBuilder builder;
  if (!nlohmann::json::sax_parse(s, &builder)) throw std::runtime_error("invalid JSON");
  return builder.take();
}

}  // namespace obs_test
