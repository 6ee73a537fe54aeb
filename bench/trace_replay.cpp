// trace_replay.cpp — replays a program's recorded allocations through the
// caching core on the fake backend, once per configuration, and reports what
// each configuration would have reserved (issue 8, item 4: memory).
//
//   trace_replay [options] TRACE...
//
// TRACE is what `CACHALLOC_CONF=trace:PATH` writes (Chrome trace-event JSON,
// docs/OBSERVABILITY.md), optionally gzipped (`.gz`, read through `gzip -dc`),
// or the compact form written by `--extract` (same events, ~20x smaller).
// Every file is a program (a process) of its own; every device in it is
// replayed on its own, one at a time.
//
// What is replayed.  Each traced `alloc` becomes a malloc of the traced size
// on the traced stream, mapped from the traced address to the replay's
// address; each `free` of a traced address frees its replay block.  The
// trace records the BLOCK size cachalloc handed out (its request rounded to
// 512 B, or a whole cached block it did not split: up to 1 MiB more in the
// large pool), not the program's requested size; when an event carries
// `args.requested` (a later writer may add it) that is used instead.  Frees
// are plain frees on the block's own stream: cross-stream fences of the
// recorded run are modelled as completing at once.  `empty_cache` events
// call empty_cache().  segment_map/segment_unmap/oom events are not
// replayed; they give the recorded run's own figures.
//
// The ring buffer behind `trace:` keeps only the newest trace_max_entries
// events: when otherData.dropped_events > 0 the replay starts mid-run, with
// memory already allocated that it knows nothing about; frees of addresses
// never allocated in the trace are skipped and counted, and the table says
// how much was allocated when the kept events begin.
//
// Figures per configuration (allocator statistics at the end of the replay,
// named as torch.cuda.memory_stats() names them):
//   reserved ÷ allocated = reserved_bytes.all.peak / allocated_bytes.all.peak
//   fragmentation        = 1 - active_bytes.all.peak / reserved_bytes.all.peak
//   ÷ trace peak         = reserved_bytes.all.peak / the peak of the traced
//                          sizes live at once (the same for every setting)
//   device allocs        = num_device_alloc (segments; pages for expandable)
//   retries, OOMs        = num_alloc_retries, num_ooms (0 unless the replay
//                          device, --device-total-gib, is too small)
//
// Options:
//   --conf TEXT          a CACHALLOC_CONF to replay (repeat; replaces the
//                        default list; "" is the defaults)
//   --device N           only device N of each trace
//   --device-total-gib G the fake device's size (default 80)
//   --json PATH          also write every figure as JSON (bench/memory_report.py)
//   --extract PATH       write the events of the (single) TRACE in the compact
//                        form and exit; PATH ending in .gz is gzipped
//   --no-empty-cache     ignore recorded empty_cache events
//   --joins              the fake driver joins fences (cuCtxWaitEvent, as
//                        drivers of CUDA 12.5 on) and completes every event
//                        as it is recorded (an idle GPU): what release_remap
//                        needs; without it the fake refuses joins
//   --front              mallocs and frees through the per-thread front
//                        cache first (core/front.h), as the shim's
//                        stream-ordered route does, one thread: what a
//                        change to what the thread caches keep does to the
//                        peak (without it the core alone, as before)
//   --quiet              no table on stdout
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "caching_allocator.h"
#include "config.h"
#include "fake_backend.h"

using namespace cachalloc;

namespace {

// ============================================================== the events

enum class Kind : std::uint8_t { alloc, free, segment_map, segment_unmap, oom, empty_cache };

struct Event {
  Kind kind;
  int device;
  std::uint64_t ptr;
  std::uint64_t size;       // block size (alloc/free), segment bytes, requested bytes (oom)
  std::uint64_t stream;
  std::uint64_t requested;  // 0: not recorded
};

struct DeviceStart {
  // allocated/reserved bytes of the recorded run just before its first kept
  // event (from the counters after it): nonzero when the ring dropped events.
  std::int64_t allocated = 0;
  std::int64_t reserved = 0;
  bool known = false;
};

struct Trace {
  std::string path;
  std::string name;               // file name without directories and suffixes
  bool has_other_data = false;
  std::uint64_t dropped = 0;      // otherData.dropped_events
  std::uint64_t max_entries = 0;  // otherData.trace_max_entries
  std::uint64_t recorded = 0;     // otherData.recorded_events
  std::int64_t pid = -1;
  std::string config;             // otherData.config, if a writer adds it
  std::vector<Event> events;
  std::map<int, DeviceStart> start;
  std::uint64_t other_phases = 0;  // events the replay does not know (ph or name)
};

// ============================================================== input

// Reads a file, or a gzip file through `gzip -dc`, in large chunks.
class Input {
 public:
  explicit Input(const std::string& path) : path_(path) {
    if (ends_with(path, ".gz")) {
      std::string cmd = "gzip -dc < " + shell_quote(path);
      f_ = popen(cmd.c_str(), "r");
      piped_ = true;
    } else {
      f_ = std::fopen(path.c_str(), "rb");
    }
    if (f_ == nullptr) throw std::runtime_error("cannot open " + path);
    buf_.resize(1 << 20);
  }
  ~Input() { close_quietly(); }
  Input(const Input&) = delete;
  Input& operator=(const Input&) = delete;

  int peek() {
    if (pos_ == len_ && !fill()) return EOF;
    return static_cast<unsigned char>(buf_[pos_]);
  }
  int get() {
    if (pos_ == len_ && !fill()) return EOF;
    return static_cast<unsigned char>(buf_[pos_++]);
  }
  bool getline(std::string* line) {
    line->clear();
    for (;;) {
      if (pos_ == len_ && !fill()) return !line->empty();
      const char* begin = buf_.data() + pos_;
      const void* nl = std::memchr(begin, '\n', len_ - pos_);
      if (nl != nullptr) {
        const std::size_t n = static_cast<const char*>(nl) - begin;
        line->append(begin, n);
        pos_ += n + 1;
        return true;
      }
      line->append(begin, len_ - pos_);
      pos_ = len_;
    }
  }
  std::uint64_t offset() const { return consumed_ + pos_; }
  // Closes; throws if gzip failed (a truncated or corrupt .gz).
  void close() {
    if (f_ == nullptr) return;
    if (piped_ && !closing_quietly_)  // let gzip finish (and report a corrupt tail) before asking how it ended
      while (std::fread(buf_.data(), 1, buf_.size(), f_) > 0) {
      }
    int rc = piped_ ? pclose(f_) : std::fclose(f_);
    f_ = nullptr;
    if (piped_ && rc != 0 && !closing_quietly_) throw std::runtime_error("gzip -dc failed on " + path_);
  }
  void close_quietly() {
    closing_quietly_ = true;
    close();
  }

  static bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
  }
  static std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) {
      if (c == '\'') out += "'\\''";
      else out += c;
    }
    return out + "'";
  }

 private:
  bool fill() {
    if (f_ == nullptr) return false;
    consumed_ += len_;
    len_ = std::fread(buf_.data(), 1, buf_.size(), f_);
    pos_ = 0;
    return len_ > 0;
  }
  std::string path_;
  FILE* f_ = nullptr;
  bool piped_ = false;
  bool closing_quietly_ = false;
  std::vector<char> buf_;
  std::size_t pos_ = 0, len_ = 0;
  std::uint64_t consumed_ = 0;
};

// ============================================================== JSON

struct JValue {
  enum Type : std::uint8_t { null, boolean, number, string, array, object } type = null;
  bool b = false;
  std::string s;  // string contents, or a number's text
  std::vector<JValue> a;
  std::vector<std::pair<std::string, JValue>> o;

  const JValue* get(std::string_view key) const {
    for (const auto& [k, v] : o)
      if (k == key) return &v;
    return nullptr;
  }
};

class JsonParser {
 public:
  explicit JsonParser(Input& in) : in_(in) {}

  [[noreturn]] void fail(const std::string& what) {
    throw std::runtime_error("JSON: " + what + " at byte " + std::to_string(in_.offset()));
  }
  void ws() {
    for (int c = in_.peek(); c == ' ' || c == '\n' || c == '\r' || c == '\t'; c = in_.peek()) in_.get();
  }
  int peek_nonspace() {
    ws();
    return in_.peek();
  }
  void expect(char c) {
    ws();
    int got = in_.get();
    if (got != c) fail(std::string("expected '") + c + "', found " + (got == EOF ? "end of file" : std::string(1, static_cast<char>(got))));
  }
  // After '[' or '{' has been read: true if there is another element.
  bool more(char close, bool first) {
    ws();
    int c = in_.peek();
    if (c == close) {
      in_.get();
      return false;
    }
    if (!first) {
      if (c != ',') fail(std::string("expected ',' or '") + close + "'");
      in_.get();
    }
    return true;
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      int c = in_.get();
      if (c == EOF) fail("unterminated string");
      if (c == '"') return out;
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      c = in_.get();
      switch (c) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && in_.peek() == '\\') {
            in_.get();
            if (in_.get() != 'u') fail("bad surrogate pair");
            unsigned lo = hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(cp, &out);
          break;
        }
        default: fail("bad escape");
      }
    }
  }

  JValue value() {
    JValue v;
    int c = peek_nonspace();
    if (c == '{') {
      in_.get();
      v.type = JValue::object;
      for (bool first = true; more('}', first); first = false) {
        std::string k = string();
        expect(':');
        v.o.emplace_back(std::move(k), value());
      }
    } else if (c == '[') {
      in_.get();
      v.type = JValue::array;
      for (bool first = true; more(']', first); first = false) v.a.push_back(value());
    } else if (c == '"') {
      v.type = JValue::string;
      v.s = string();
    } else if (c == 't' || c == 'f' || c == 'n') {
      std::string word;
      while (std::isalpha(in_.peek())) word += static_cast<char>(in_.get());
      if (word == "true") v = boolean(true);
      else if (word == "false") v = boolean(false);
      else if (word != "null") fail("bad literal '" + word + "'");
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.type = JValue::number;
      for (int d = in_.peek(); d > 0 && std::strchr("+-.eE0123456789", d) != nullptr; d = in_.peek())
        v.s += static_cast<char>(in_.get());
    } else {
      fail(c == EOF ? "unexpected end of file" : std::string("unexpected '") + static_cast<char>(c) + "'");
    }
    return v;
  }

 private:
  static JValue boolean(bool b) {
    JValue v;
    v.type = JValue::boolean;
    v.b = b;
    return v;
  }
  unsigned hex4() {
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      int c = in_.get();
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else fail("bad \\u escape");
    }
    return v;
  }
  static void utf8(unsigned cp, std::string* out) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  Input& in_;
};

std::uint64_t to_u64(const std::string& text, int base, const char* what) {
  std::string_view t = text;
  if (base == 16 && (t.starts_with("0x") || t.starts_with("0X"))) t.remove_prefix(2);
  if (t.empty()) throw std::runtime_error(std::string("empty ") + what);
  std::uint64_t v = 0;
  for (char c : t) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (base == 16 && c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else throw std::runtime_error(std::string("bad ") + what + " '" + text + "'");
    v = v * static_cast<std::uint64_t>(base) + static_cast<std::uint64_t>(d);
  }
  return v;
}

std::int64_t to_i64(const std::string& text, const char* what) {
  if (!text.empty() && text[0] == '-') return -static_cast<std::int64_t>(to_u64(text.substr(1), 10, what));
  return static_cast<std::int64_t>(to_u64(text, 10, what));
}

std::uint64_t num_field(const JValue& obj, const char* key, bool required = true) {
  const JValue* v = obj.get(key);
  if (v == nullptr || v->type != JValue::number) {
    if (required) throw std::runtime_error(std::string("event without a numeric '") + key + "'");
    return 0;
  }
  return to_u64(v->s, 10, key);
}

std::uint64_t hex_field(const JValue& obj, const char* key) {
  const JValue* v = obj.get(key);
  if (v == nullptr) throw std::runtime_error(std::string("event without '") + key + "'");
  if (v->type == JValue::number) return to_u64(v->s, 10, key);
  if (v->type != JValue::string) throw std::runtime_error(std::string("bad '") + key + "'");
  return to_u64(v->s, 16, key);
}

std::optional<Kind> kind_named(const std::string& name) {
  if (name == "alloc") return Kind::alloc;
  if (name == "free") return Kind::free;
  if (name == "segment_map") return Kind::segment_map;
  if (name == "segment_unmap") return Kind::segment_unmap;
  if (name == "oom") return Kind::oom;
  if (name == "empty_cache") return Kind::empty_cache;
  return std::nullopt;
}

// Change of allocated / reserved bytes an event makes in the recorded run.
std::int64_t allocated_delta(const Event& e) {
  if (e.kind == Kind::alloc) return static_cast<std::int64_t>(e.size);
  if (e.kind == Kind::free) return -static_cast<std::int64_t>(e.size);
  return 0;
}
std::int64_t reserved_delta(const Event& e) {
  if (e.kind == Kind::segment_map) return static_cast<std::int64_t>(e.size);
  if (e.kind == Kind::segment_unmap) return -static_cast<std::int64_t>(e.size);
  return 0;
}

class TraceLoader {
 public:
  explicit TraceLoader(Trace* t) : t_(t) {}

  void element(const JValue& e) {
    if (e.type != JValue::object) return;
    const JValue* ph = e.get("ph");
    const JValue* name = e.get("name");
    if (ph == nullptr || name == nullptr || ph->type != JValue::string || name->type != JValue::string) {
      ++t_->other_phases;
      return;
    }
    if (ph->s == "M") {
      if (const JValue* pid = e.get("pid"); pid != nullptr && pid->type == JValue::number)
        t_->pid = to_i64(pid->s, "pid");
      return;
    }
    if (ph->s == "i") return instant(e, name->s);
    if (ph->s == "C") return counter(e, name->s);
    ++t_->other_phases;
  }

  void other_data(const JValue& o) {
    if (o.type != JValue::object) return;
    t_->has_other_data = true;
    t_->dropped = num_field(o, "dropped_events", false);
    t_->max_entries = num_field(o, "trace_max_entries", false);
    t_->recorded = num_field(o, "recorded_events", false);
    if (const JValue* c = o.get("config"); c != nullptr && c->type == JValue::string) t_->config = c->s;
  }

 private:
  void instant(const JValue& e, const std::string& name) {
    auto kind = kind_named(name);
    if (!kind) {
      ++t_->other_phases;
      return;
    }
    const JValue* args = e.get("args");
    if (args == nullptr || args->type != JValue::object) throw std::runtime_error("instant event without args");
    Event ev{};
    ev.kind = *kind;
    if (args->get("device") != nullptr) ev.device = static_cast<int>(num_field(*args, "device"));
    else ev.device = static_cast<int>(num_field(e, "tid"));
    ev.ptr = hex_field(*args, "ptr");
    ev.size = num_field(*args, "size");
    ev.stream = hex_field(*args, "stream");
    ev.requested = num_field(*args, "requested", false);
    t_->events.push_back(ev);
    last_device_ = ev.device;
  }

  // "allocated bytes (device N)" / "reserved bytes (device N)", right after
  // the instant event they describe (the state after it).  Only the first
  // of each device matters: it gives the state before the first kept event.
  void counter(const JValue& e, const std::string& name) {
    const bool allocated = name.starts_with("allocated bytes");
    const bool reserved = name.starts_with("reserved bytes");
    if (!allocated && !reserved) return;
    const auto open = name.find("(device ");
    if (open == std::string::npos) return;
    const int device = static_cast<int>(to_u64(name.substr(open + 8, name.find(')', open) - open - 8), 10, "device"));
    const JValue* args = e.get("args");
    if (args == nullptr) return;
    const JValue* bytes = args->get("bytes");
    if (bytes == nullptr || bytes->type != JValue::number) return;
    const std::int64_t after = to_i64(bytes->s, "bytes");
    auto& seen = allocated ? seen_allocated_ : seen_reserved_;
    if (!seen.insert(device).second) return;
    // The first event of this device in the file is the one before its first counter.
    const Event* first = nullptr;
    for (const Event& ev : t_->events)
      if (ev.device == device) {
        first = &ev;
        break;
      }
    DeviceStart& s = t_->start[device];
    s.known = first != nullptr;
    if (first == nullptr) return;
    if (allocated) s.allocated = after - allocated_delta(*first);
    else s.reserved = after - reserved_delta(*first);
  }

  Trace* t_;
  int last_device_ = -1;
  std::set<int> seen_allocated_, seen_reserved_;
};

std::string base_name(const std::string& path) {
  std::string n = path.substr(path.find_last_of('/') + 1);
  for (const char* suffix : {".gz", ".replay", ".txt", ".json"})
    if (Input::ends_with(n, suffix)) n.resize(n.size() - std::strlen(suffix));
  return n;
}

void load_json(Input& in, Trace* t) {
  JsonParser p(in);
  TraceLoader loader(t);
  int c = p.peek_nonspace();
  auto stream_events = [&] {
    p.expect('[');
    for (bool first = true; p.more(']', first); first = false) loader.element(p.value());
  };
  if (c == '[') {  // the array form of the trace-event format
    stream_events();
    return;
  }
  p.expect('{');
  for (bool first = true; p.more('}', first); first = false) {
    std::string key = p.string();
    p.expect(':');
    if (key == "traceEvents") {
      stream_events();
    } else {
      JValue v = p.value();
      if (key == "otherData") loader.other_data(v);
    }
  }
}

// The compact form (--extract): a header of "key value" lines, then one
// event per line.  Numbers decimal, addresses and streams hex.
//   cachalloc-replay 1
//   source PATH | pid N | dropped_events N | trace_max_entries N |
//   recorded_events N | other_data 0/1 | config TEXT |
//   start DEVICE ALLOCATED RESERVED
//   events
//   a DEV PTR SIZE STREAM [REQUESTED] | f DEV PTR SIZE STREAM |
//   m DEV PTR SIZE STREAM | u DEV PTR SIZE STREAM | o DEV SIZE STREAM | e DEV
constexpr const char* kCompactMagic = "cachalloc-replay 1";

void load_compact(Input& in, Trace* t) {
  std::string line;
  in.getline(&line);
  if (line != kCompactMagic) throw std::runtime_error("not a cachalloc-replay file: " + t->path);
  bool in_events = false;
  std::vector<std::string> f;
  while (in.getline(&line)) {
    if (line.empty()) continue;
    if (!in_events) {
      const auto sp = line.find(' ');
      const std::string key = line.substr(0, sp);
      const std::string val = sp == std::string::npos ? "" : line.substr(sp + 1);
      if (key == "events") in_events = true;
      else if (key == "pid") t->pid = to_i64(val, "pid");
      else if (key == "dropped_events") t->dropped = to_u64(val, 10, key.c_str());
      else if (key == "trace_max_entries") t->max_entries = to_u64(val, 10, key.c_str());
      else if (key == "recorded_events") t->recorded = to_u64(val, 10, key.c_str());
      else if (key == "other_data") t->has_other_data = val == "1";
      else if (key == "config") t->config = val;
      else if (key == "start") {
        int dev = 0;
        long long a = 0, r = 0;
        if (std::sscanf(val.c_str(), "%d %lld %lld", &dev, &a, &r) != 3) throw std::runtime_error("bad start line");
        t->start[dev] = DeviceStart{a, r, true};
      }
      continue;
    }
    f.clear();
    for (std::size_t i = 0; i < line.size();) {
      std::size_t j = line.find(' ', i);
      if (j == std::string::npos) j = line.size();
      f.push_back(line.substr(i, j - i));
      i = j + 1;
    }
    if (f.size() < 2 || f[0].size() != 1) throw std::runtime_error("bad event line '" + line + "'");
    Event ev{};
    ev.device = static_cast<int>(to_u64(f[1], 10, "device"));
    const char k = f[0][0];
    auto need = [&](std::size_t n) {
      if (f.size() < n) throw std::runtime_error("short event line '" + line + "'");
    };
    switch (k) {
      case 'a': case 'f': case 'm': case 'u':
        need(5);
        ev.kind = k == 'a' ? Kind::alloc : k == 'f' ? Kind::free : k == 'm' ? Kind::segment_map : Kind::segment_unmap;
        ev.ptr = to_u64(f[2], 16, "ptr");
        ev.size = to_u64(f[3], 10, "size");
        ev.stream = to_u64(f[4], 16, "stream");
        if (f.size() > 5) ev.requested = to_u64(f[5], 10, "requested");
        break;
      case 'o':
        need(4);
        ev.kind = Kind::oom;
        ev.size = to_u64(f[2], 10, "size");
        ev.stream = to_u64(f[3], 16, "stream");
        break;
      case 'e': ev.kind = Kind::empty_cache; break;
      default: throw std::runtime_error("bad event line '" + line + "'");
    }
    t->events.push_back(ev);
  }
}

Trace load_trace(const std::string& path) {
  Trace t;
  t.path = path;
  t.name = base_name(path);
  Input in(path);
  int c;
  while ((c = in.peek()) == ' ' || c == '\n' || c == '\r' || c == '\t') in.get();
  if (c == '{' || c == '[') load_json(in, &t);
  else load_compact(in, &t);
  in.close();
  return t;
}

void write_compact(const Trace& t, const std::string& path) {
  FILE* out = nullptr;
  const bool gz = Input::ends_with(path, ".gz");
  if (gz) out = popen(("gzip -9 -c > " + Input::shell_quote(path)).c_str(), "w");
  else out = std::fopen(path.c_str(), "w");
  if (out == nullptr) throw std::runtime_error("cannot write " + path);
  std::fprintf(out, "%s\nsource %s\npid %lld\ndropped_events %llu\ntrace_max_entries %llu\nrecorded_events %llu\n"
               "other_data %d\n", kCompactMagic, t.path.c_str(), static_cast<long long>(t.pid),
               static_cast<unsigned long long>(t.dropped), static_cast<unsigned long long>(t.max_entries),
               static_cast<unsigned long long>(t.recorded), t.has_other_data ? 1 : 0);
  if (!t.config.empty()) std::fprintf(out, "config %s\n", t.config.c_str());
  for (const auto& [dev, s] : t.start)
    if (s.known) std::fprintf(out, "start %d %lld %lld\n", dev, static_cast<long long>(s.allocated),
                              static_cast<long long>(s.reserved));
  std::fprintf(out, "events\n");
  for (const Event& e : t.events) {
    switch (e.kind) {
      case Kind::alloc: case Kind::free: case Kind::segment_map: case Kind::segment_unmap: {
        const char k = e.kind == Kind::alloc ? 'a' : e.kind == Kind::free ? 'f' : e.kind == Kind::segment_map ? 'm' : 'u';
        std::fprintf(out, "%c %d %llx %llu %llx", k, e.device, static_cast<unsigned long long>(e.ptr),
                     static_cast<unsigned long long>(e.size), static_cast<unsigned long long>(e.stream));
        if (e.requested != 0) std::fprintf(out, " %llu", static_cast<unsigned long long>(e.requested));
        std::fputc('\n', out);
        break;
      }
      case Kind::oom:
        std::fprintf(out, "o %d %llu %llx\n", e.device, static_cast<unsigned long long>(e.size),
                     static_cast<unsigned long long>(e.stream));
        break;
      case Kind::empty_cache: std::fprintf(out, "e %d\n", e.device); break;
    }
  }
  const int rc = gz ? pclose(out) : std::fclose(out);
  if (rc != 0) throw std::runtime_error("writing " + path + " failed");
}

// ============================================================== the replay

// What the trace itself says about one device (the same for every setting).
struct TraceFigures {
  std::uint64_t events = 0, allocs = 0, frees = 0, empty_caches = 0;
  std::uint64_t skipped_frees = 0;      // frees of addresses never allocated in the trace
  std::uint64_t live_reallocs = 0;      // allocs of an address still live in the trace (implied free)
  std::uint64_t requested_sizes = 0;    // allocs that carried a requested size
  std::uint64_t peak_live = 0;          // peak of the replayed sizes live at once
  std::uint64_t live_at_end = 0;        // replayed bytes still live when the trace ends
  std::set<std::uint64_t> streams;      // streams of the traced allocations
  // The recorded run (cachalloc, whatever configuration it had):
  std::int64_t start_allocated = 0, start_reserved = 0;
  std::int64_t rec_peak_allocated = 0, rec_peak_reserved = 0;
  std::uint64_t rec_segment_maps = 0, rec_segment_unmaps = 0, rec_ooms = 0;
};

struct Setting {
  std::string conf;  // CACHALLOC_CONF text; "" = defaults
  Config config;
};

struct Outcome {
  std::string conf;
  DeviceStats stats;
  std::uint64_t failed_allocs = 0;  // replay mallocs that failed (then their frees are skipped)
  std::uint64_t frees_of_failed = 0;
  std::uint64_t front_hits = 0;     // --front: mallocs the thread's cache served
  std::string error;                // validate() or backend failure
  double seconds = 0;
};

TraceFigures trace_figures(const Trace& t, int device, bool honour_empty_cache) {
  TraceFigures f;
  const auto st = t.start.find(device);
  if (st != t.start.end()) {
    f.start_allocated = st->second.allocated;
    f.start_reserved = st->second.reserved;
  }
  std::int64_t alloc_now = f.start_allocated, res_now = f.start_reserved;
  f.rec_peak_allocated = alloc_now;
  f.rec_peak_reserved = res_now;
  std::unordered_map<std::uint64_t, std::uint64_t> live;
  std::uint64_t live_bytes = 0;
  for (const Event& e : t.events) {
    if (e.device != device) continue;
    ++f.events;
    alloc_now += allocated_delta(e);
    res_now += reserved_delta(e);
    f.rec_peak_allocated = std::max(f.rec_peak_allocated, alloc_now);
    f.rec_peak_reserved = std::max(f.rec_peak_reserved, res_now);
    switch (e.kind) {
      case Kind::alloc: {
        ++f.allocs;
        if (e.requested != 0) ++f.requested_sizes;
        f.streams.insert(e.stream);
        const std::uint64_t size = e.requested != 0 ? e.requested : e.size;
        auto [it, fresh] = live.try_emplace(e.ptr, size);
        if (!fresh) {
          ++f.live_reallocs;
          live_bytes -= it->second;
          it->second = size;
        }
        live_bytes += size;
        f.peak_live = std::max(f.peak_live, live_bytes);
        break;
      }
      case Kind::free: {
        ++f.frees;
        auto it = live.find(e.ptr);
        if (it == live.end()) {
          ++f.skipped_frees;
          break;
        }
        live_bytes -= it->second;
        live.erase(it);
        break;
      }
      case Kind::segment_map: ++f.rec_segment_maps; break;
      case Kind::segment_unmap: ++f.rec_segment_unmaps; break;
      case Kind::oom: ++f.rec_ooms; break;
      case Kind::empty_cache: f.empty_caches += honour_empty_cache ? 1 : 0; break;
    }
  }
  f.live_at_end = live_bytes;
  return f;
}

Outcome replay(const Trace& t, int device, const Setting& s, std::size_t device_total, bool honour_empty_cache,
               bool joins, bool front) {
  Outcome out;
  out.conf = s.conf;
  const auto t0 = std::chrono::steady_clock::now();
  testing::FakeBackend backend(device_total);
  backend.allow_joins(joins);
  backend.set_auto_complete(joins);
  {
    CachingAllocator alloc(&backend, s.config, device);
    std::unordered_map<std::uint64_t, DevicePtr> live;  // traced address -> replay block (0: its malloc failed)
    live.reserve(1 << 16);
    auto release = [&](DevicePtr p) {
      if (p == 0) {
        ++out.frees_of_failed;
        return;
      }
      const Status st = front ? alloc.front().free_cached(p, kAnyStream) : alloc.free(p);
      if (st != kSuccess && out.error.empty()) out.error = "free returned " + std::to_string(st);
    };
    for (const Event& e : t.events) {
      if (e.device != device) continue;
      if (e.kind == Kind::alloc) {
        auto it = live.find(e.ptr);
        if (it != live.end()) {  // the recorded run must have freed it unseen
          release(it->second);
          live.erase(it);
        }
        DevicePtr p = 0;
        const std::uint64_t size = e.requested != 0 ? e.requested : e.size;
        const bool hit = front && alloc.front().malloc_cached(&p, size, e.stream);
        out.front_hits += hit;
        const Status st = hit ? kSuccess : alloc.malloc(&p, size, e.stream);
        if (st != kSuccess) {
          ++out.failed_allocs;
          if (st != kOutOfMemory && out.error.empty()) out.error = "malloc returned " + std::to_string(st);
          p = 0;
        }
        live.emplace(e.ptr, p);
      } else if (e.kind == Kind::free) {
        auto it = live.find(e.ptr);
        if (it == live.end()) continue;  // counted once in trace_figures
        release(it->second);
        live.erase(it);
      } else if (e.kind == Kind::empty_cache && honour_empty_cache) {
        alloc.empty_cache();
      }
    }
    out.stats = alloc.stats();
    try {
      alloc.validate();
    } catch (const std::exception& ex) {
      if (out.error.empty()) out.error = std::string("validate: ") + ex.what();
    }
    for (auto& [traced, p] : live)
      if (p != 0) alloc.free(p);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

// ============================================================== output

std::string bytes_text(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%.0f B", b);
  else std::snprintf(buf, sizeof buf, "%.2f %s", b, units[u]);
  return buf;
}

double ratio(std::int64_t a, std::int64_t b) { return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0; }

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string setting_name(const std::string& conf) { return conf.empty() ? "classic (defaults)" : conf; }

std::string stream_list(const std::set<std::uint64_t>& streams) {
  std::string out;
  for (std::uint64_t s : streams) {
    if (!out.empty()) out += ", ";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%#llx", static_cast<unsigned long long>(s));
    out += buf;
  }
  return out;
}

void print_table(const Trace& t, int device, const TraceFigures& f, const std::vector<Outcome>& outs,
                 std::size_t device_total) {
  std::printf("### %s, device %d\n\n", t.name.c_str(), device);
  std::printf("`%s`: %llu events on this device: %llu allocations, %llu frees, %llu empty_cache; streams %s; "
              "peak of traced sizes live at once %s; %s live when the trace ends.\n",
              t.path.c_str(), static_cast<unsigned long long>(f.events), static_cast<unsigned long long>(f.allocs),
              static_cast<unsigned long long>(f.frees), static_cast<unsigned long long>(f.empty_caches),
              stream_list(f.streams).c_str(), bytes_text(static_cast<double>(f.peak_live)).c_str(),
              bytes_text(static_cast<double>(f.live_at_end)).c_str());
  std::vector<std::string> notes;
  if (!t.has_other_data) {
    notes.push_back("the file has no otherData: whether the ring dropped events is unknown");
  } else if (t.dropped > 0) {
    notes.push_back("INCOMPLETE: the ring (trace_max_entries " + std::to_string(t.max_entries) + ") dropped the " +
                    std::to_string(t.dropped) + " oldest events; when the kept events begin the recorded run had " +
                    bytes_text(static_cast<double>(f.start_allocated)) + " allocated and " +
                    bytes_text(static_cast<double>(f.start_reserved)) +
                    " reserved that the replay does not see (raise trace_max_entries or run fewer steps)");
  }
  if (t.has_other_data && t.recorded != 0) {
    std::uint64_t all = t.events.size();
    if (all != t.recorded)
      notes.push_back("the file holds " + std::to_string(all) + " events but otherData says " +
                      std::to_string(t.recorded) + " were written (truncated or edited?)");
  }
  if (f.skipped_frees > 0)
    notes.push_back(std::to_string(f.skipped_frees) + " frees of addresses never allocated in the trace were skipped");
  if (f.live_reallocs > 0)
    notes.push_back(std::to_string(f.live_reallocs) +
                    " allocations reused an address still live in the trace (treated as freed just before)");
  if (f.requested_sizes < f.allocs)
    notes.push_back(f.requested_sizes == 0
                        ? "sizes are the recorded run's block sizes (the trace has no requested size): rounding "
                          "settings can only round further, never less"
                        : std::to_string(f.allocs - f.requested_sizes) + " allocations have no requested size (block size used)");
  if (!t.config.empty()) notes.push_back("recorded with `" + t.config + "`");
  notes.push_back("cross-stream fences of frees complete at once; fake device " +
                  bytes_text(static_cast<double>(device_total)));
  for (const std::string& n : notes) std::printf("- %s\n", n.c_str());
  std::printf("\n| setting | peak reserved | peak allocated | reserved ÷ allocated | fragmentation | "
              "reserved ÷ trace peak | device allocs | peak segments | retries | OOMs |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::printf("| recorded run (from the trace) | %s | %s | %s | n/a | %s | %llu maps | n/a | n/a | %llu |\n",
              bytes_text(static_cast<double>(f.rec_peak_reserved)).c_str(),
              bytes_text(static_cast<double>(f.rec_peak_allocated)).c_str(),
              fixed(ratio(f.rec_peak_reserved, f.rec_peak_allocated), 3).c_str(),
              fixed(ratio(f.rec_peak_reserved, static_cast<std::int64_t>(f.peak_live)), 3).c_str(),
              static_cast<unsigned long long>(f.rec_segment_maps), static_cast<unsigned long long>(f.rec_ooms));
  for (const Outcome& o : outs) {
    const auto& s = o.stats;
    const std::int64_t res = s.reserved_bytes[StatType::aggregate].peak;
    const std::int64_t all = s.allocated_bytes[StatType::aggregate].peak;
    const std::int64_t act = s.active_bytes[StatType::aggregate].peak;
    std::string name = setting_name(o.conf);
    if (!o.error.empty()) name += " (ERROR: " + o.error + ")";
    std::printf("| %s | %s | %s | %s | %s | %s | %lld | %lld | %lld | %lld |\n", name.c_str(),
                bytes_text(static_cast<double>(res)).c_str(), bytes_text(static_cast<double>(all)).c_str(),
                fixed(ratio(res, all), 3).c_str(), fixed(res > 0 ? 1.0 - ratio(act, res) : 0.0, 3).c_str(),
                fixed(ratio(res, static_cast<std::int64_t>(f.peak_live)), 3).c_str(),
                static_cast<long long>(s.num_device_alloc), static_cast<long long>(s.segment[StatType::aggregate].peak),
                static_cast<long long>(s.num_alloc_retries), static_cast<long long>(s.num_ooms));
  }
  std::printf("\n");
}

std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_entry(const Trace& t, int device, const TraceFigures& f, const std::vector<Outcome>& outs,
                       std::size_t device_total) {
  std::string j = "{";
  auto num = [&](const char* k, auto v, bool comma = true) {
    j += json_str(k) + ":" + std::to_string(v) + (comma ? "," : "");
  };
  j += "\"file\":" + json_str(t.path) + ",\"name\":" + json_str(t.name) + ",";
  num("device", device);
  num("pid", t.pid);
  j += "\"other_data\":" + std::string(t.has_other_data ? "true" : "false") + ",";
  num("dropped_events", t.dropped);
  num("trace_max_entries", t.max_entries);
  num("recorded_events", t.recorded);
  j += "\"recorded_config\":" + json_str(t.config) + ",";
  num("events", f.events);
  num("allocs", f.allocs);
  num("frees", f.frees);
  num("empty_caches", f.empty_caches);
  num("skipped_frees", f.skipped_frees);
  num("live_reallocs", f.live_reallocs);
  num("requested_sizes", f.requested_sizes);
  num("trace_peak_live", f.peak_live);
  num("live_at_end", f.live_at_end);
  j += "\"streams\":[";
  for (auto it = f.streams.begin(); it != f.streams.end(); ++it)
    j += (it == f.streams.begin() ? "" : ",") + std::to_string(*it);
  j += "],";
  num("device_total", device_total);
  j += "\"recorded\":{";
  num("start_allocated", f.start_allocated);
  num("start_reserved", f.start_reserved);
  num("peak_allocated", f.rec_peak_allocated);
  num("peak_reserved", f.rec_peak_reserved);
  num("segment_maps", f.rec_segment_maps);
  num("segment_unmaps", f.rec_segment_unmaps);
  num("ooms", f.rec_ooms, false);
  j += "},\"settings\":[";
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const Outcome& o = outs[i];
    const auto& s = o.stats;
    const auto A = StatType::aggregate;
    j += (i ? "," : "") + std::string("{\"conf\":") + json_str(o.conf) + ",\"name\":" + json_str(setting_name(o.conf)) + ",";
    num("peak_reserved", s.reserved_bytes[A].peak);
    num("peak_allocated", s.allocated_bytes[A].peak);
    num("peak_active", s.active_bytes[A].peak);
    num("peak_requested", s.requested_bytes[A].peak);
    num("peak_inactive_split", s.inactive_split_bytes[A].peak);
    num("num_device_alloc", s.num_device_alloc);
    num("num_device_free", s.num_device_free);
    num("peak_segments", s.segment[A].peak);
    num("num_alloc_retries", s.num_alloc_retries);
    num("num_ooms", s.num_ooms);
    num("num_sync_all_streams", s.num_sync_all_streams);
    num("failed_allocs", o.failed_allocs);
    num("front_hits", o.front_hits);
    num("frees_of_failed", o.frees_of_failed);
    j += "\"reserved_over_allocated\":" + fixed(ratio(s.reserved_bytes[A].peak, s.allocated_bytes[A].peak), 6) + ",";
    j += "\"fragmentation\":" +
         fixed(s.reserved_bytes[A].peak > 0 ? 1.0 - ratio(s.active_bytes[A].peak, s.reserved_bytes[A].peak) : 0.0, 6) + ",";
    j += "\"reserved_over_trace_peak\":" +
         fixed(ratio(s.reserved_bytes[A].peak, static_cast<std::int64_t>(f.peak_live)), 6) + ",";
    j += "\"seconds\":" + fixed(o.seconds, 4) + ",";
    j += "\"error\":" + json_str(o.error) + "}";
  }
  j += "]}";
  return j;
}

// The default list: the recording's own setting first (so the replay can be
// checked against the recorded run), then one knob at a time.
//   roundup_power2_divisions 4 / 8: coarse and fine rounding of every size
//     (less reuse failure, more internal waste); [256:1,512:2,>:8] is the
//     mixed form PyTorch's docs show (no extra rounding below 256 MiB).
//   max_split_size_mb 64 and 256 (the value usually advised against
//     fragmentation).  cachalloc accepts 20, its minimum (no large block is
//     ever split), but PyTorch refuses values <= 20, so no PyTorch run could
//     stand beside it; --conf max_split_size_mb:20 still replays it.
//   expandable segments, alone and with the mixed rounding.
const std::vector<std::string> kDefaultConfs = {
    "",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:8",
    "roundup_power2_divisions:[256:1,512:2,>:8]",
    "max_split_size_mb:64",
    "max_split_size_mb:256",
    "expandable_segments:true",
    "expandable_segments:true,roundup_power2_divisions:[256:1,512:2,>:8]",
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "trace_replay: %s\nusage: trace_replay [--conf TEXT]... [--device N] [--device-total-gib G] "
               "[--json PATH] [--extract PATH] [--no-empty-cache] [--joins] [--front] [--quiet] TRACE...\n",
               msg);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> confs, files;
  bool confs_given = false, quiet = false, honour_empty_cache = true, joins = false, front = false;
  std::optional<int> only_device;
  double total_gib = 80;
  std::string json_path, extract_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto arg = [&]() -> std::string {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--conf") {
      confs.push_back(arg());
      confs_given = true;
    } else if (a == "--device") {
      only_device = std::atoi(arg().c_str());
    } else if (a == "--device-total-gib") {
      total_gib = std::atof(arg().c_str());
      if (!(total_gib > 0)) usage("--device-total-gib must be positive");
    } else if (a == "--json") {
      json_path = arg();
    } else if (a == "--extract") {
      extract_path = arg();
    } else if (a == "--no-empty-cache") {
      honour_empty_cache = false;
    } else if (a == "--joins") {
      joins = true;
    } else if (a == "--front") {
      front = true;
    } else if (a == "--quiet") {
      quiet = true;
    } else if (a == "-h" || a == "--help") {
      usage("replays cachalloc traces through the core on the fake backend");
    } else if (a.starts_with("--")) {
      usage(("unknown option " + a).c_str());
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) usage("no trace given");
  if (!confs_given) confs = kDefaultConfs;

  std::vector<Setting> settings;
  for (const std::string& c : confs) {
    Setting s{c, Config{}};
    std::string err = parse_config(c, &s.config);
    if (!err.empty()) usage(("bad --conf '" + c + "': " + err).c_str());
    settings.push_back(std::move(s));
  }
  const auto device_total = static_cast<std::size_t>(total_gib * static_cast<double>(GiB));

  if (!extract_path.empty()) {
    if (files.size() != 1) usage("--extract takes exactly one trace");
    try {
      Trace t = load_trace(files[0]);
      write_compact(t, extract_path);
      std::fprintf(stderr, "trace_replay: %zu events of %s written to %s\n", t.events.size(), files[0].c_str(),
                   extract_path.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "trace_replay: %s: %s\n", files[0].c_str(), e.what());
      return 1;
    }
    return 0;
  }

  int failures = 0;
  std::vector<std::string> entries;
  for (const std::string& path : files) {
    Trace t;
    try {
      t = load_trace(path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "trace_replay: %s: %s\n", path.c_str(), e.what());
      ++failures;
      continue;
    }
    std::set<int> devices;
    for (const Event& e : t.events) devices.insert(e.device);
    if (devices.empty() && !quiet) std::printf("### %s\n\n`%s` holds no allocation events.\n\n", t.name.c_str(), path.c_str());
    for (int device : devices) {
      if (only_device && *only_device != device) continue;
      const TraceFigures f = trace_figures(t, device, honour_empty_cache);
      std::vector<Outcome> outs;
      for (const Setting& s : settings) {
        outs.push_back(replay(t, device, s, device_total, honour_empty_cache, joins, front));
        if (!outs.back().error.empty()) ++failures;
      }
      if (!quiet) print_table(t, device, f, outs, device_total);
      entries.push_back(json_entry(t, device, f, outs, device_total));
    }
  }
  if (!json_path.empty()) {
    FILE* out = std::fopen(json_path.c_str(), "w");
    if (out == nullptr) {
      std::fprintf(stderr, "trace_replay: cannot write %s\n", json_path.c_str());
      return 1;
    }
    std::fprintf(out, "{\"version\":1,\"traces\":[\n");
    for (std::size_t i = 0; i < entries.size(); ++i)
      std::fprintf(out, "%s%s\n", entries[i].c_str(), i + 1 < entries.size() ? "," : "");
    std::fprintf(out, "]}\n");
    std::fclose(out);
  }
  return failures == 0 ? 0 : 1;
}
