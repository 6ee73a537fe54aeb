// graph_owners.cpp — tokens, and the graphs and execs that keep them.
#include "graph_owners.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "capture_tracking.h"
#include "context_registry.h"
#include "log.h"
#include "real_driver.h"

namespace cachalloc::shim {
namespace {

struct Token {
  int count = 0;           // what keeps it alive (header: the invariant)
  bool capturing = false;  // its capture is in flight
  int pins = 0;
  std::vector<std::uint64_t> keeps;  // union tokens this one keeps alive
  std::vector<CUcontext> ctxs;       // contexts that hold blocks for it
};

using Set = std::vector<std::uint64_t>;  // sorted, distinct

struct Registry {
  std::mutex mutex;
  std::uint64_t next = 1;
  std::unordered_map<std::uint64_t, Token> tokens;
  std::unordered_map<CUgraph, Set> graphs;
  std::unordered_map<CUgraphExec, Set> execs;
  // Union tokens alive, by the tokens they unite: one union per set.
  std::vector<std::pair<Set, std::uint64_t>> unions;
};

Registry& reg() {
  static auto* r = new Registry();  // never destroyed: graphs may be destroyed at exit
  return *r;
}

// Releases run outside the lock: (context, token) pairs.
using Releases = std::vector<std::pair<CUcontext, std::uint64_t>>;

void unref_locked(Registry& r, std::uint64_t id, Releases* out) {
  auto it = r.tokens.find(id);
  if (it == r.tokens.end()) return;
  if (--it->second.count > 0) return;
  Token t = std::move(it->second);
  r.tokens.erase(it);
  std::erase_if(r.unions, [&](const auto& u) { return u.second == id; });
  for (CUcontext c : t.ctxs) out->emplace_back(c, id);
  for (std::uint64_t u : t.keeps) unref_locked(r, u, out);
}

// The released blocks wait for a fence over all the context's work (the
// graph's last replay may still run); it is recorded now, with the context
// current, rather than at the next miss that finds enough frees waiting:
// a graph's blocks are often few and large.  Not while a capture is in
// flight (a fence would break it): they then wait for a later miss.
void run_releases(const Releases& rel) {
  for (const auto& [ctx, token] : rel) {
    ContextState* state = live_state_of(ctx);
    if (state == nullptr) continue;  // the context died, and its memory with it
    const std::size_t bytes = state->allocator().release_owner(token);
    if (bytes != 0 && !capture_in_flight()) {
      ContextGuard guard(real_driver(), ctx);
      state->allocator().reclaim();
    }
    if (bytes != 0 && obs::logger().should_log(LogLevel::debug))
      obs::logger().debug("graph capture token {}: its last graph is gone, {} bytes reusable after a fence", token,
                          bytes);
  }
}

// Adds `tokens` to `set` (an entry), counting each one added.
void add_all_locked(Registry& r, Set& set, const Set& tokens) {
  for (std::uint64_t t : tokens) {
    auto it = r.tokens.find(t);
    if (it == r.tokens.end()) continue;
    auto pos = std::lower_bound(set.begin(), set.end(), t);
    if (pos != set.end() && *pos == t) continue;
    set.insert(pos, t);
    it->second.count++;
  }
}

template <class Map, class Key>
void drop_entry(Map& map, Key key) {
  Registry& r = reg();
  Releases rel;
  {
    std::lock_guard lock(r.mutex);
    auto it = map.find(key);
    if (it == map.end()) return;
    Set set = std::move(it->second);
    map.erase(it);
    for (std::uint64_t t : set) unref_locked(r, t, &rel);
  }
  run_releases(rel);
}

}  // namespace

std::uint64_t open_capture_token() {
  Registry& r = reg();
  std::lock_guard lock(r.mutex);
  const std::uint64_t id = r.next++;
  Token& t = r.tokens[id];
  t.count = 1;
  t.capturing = true;
  return id;
}

void close_capture_token(std::uint64_t token, CUgraph graph, CUgraph into) {
  Registry& r = reg();
  Releases rel;
  {
    std::lock_guard lock(r.mutex);
    auto it = r.tokens.find(token);
    if (it == r.tokens.end()) return;
    it->second.capturing = false;
    if (graph != nullptr) add_all_locked(r, r.graphs[graph], {token});
    if (into != nullptr && into != graph) add_all_locked(r, r.graphs[into], {token});
    unref_locked(r, token, &rel);
  }
  run_releases(rel);
}

std::uint64_t pin_token(CUcontext ctx, const std::vector<std::uint64_t>& captures, std::uint64_t owner) {
  Registry& r = reg();
  std::lock_guard lock(r.mutex);
  Set set;
  for (std::uint64_t t : captures)
    if (r.tokens.count(t) != 0) set.push_back(t);
  if (owner != 0 && r.tokens.count(owner) != 0) set.push_back(owner);
  std::sort(set.begin(), set.end());
  set.erase(std::unique(set.begin(), set.end()), set.end());
  if (set.empty()) return 0;
  std::uint64_t id = set.front();
  if (set.size() > 1) {
    auto u = std::find_if(r.unions.begin(), r.unions.end(), [&](const auto& e) { return e.first == set; });
    if (u != r.unions.end()) {
      id = u->second;
    } else {
      // A union: each token it unites keeps it alive.
      id = r.next++;
      Token& t = r.tokens[id];
      for (std::uint64_t c : set) {
        r.tokens[c].keeps.push_back(id);
        t.count++;
      }
      r.unions.emplace_back(set, id);
    }
  }
  Token& t = r.tokens[id];
  t.count++;
  t.pins++;
  if (ctx != nullptr && std::find(t.ctxs.begin(), t.ctxs.end(), ctx) == t.ctxs.end()) t.ctxs.push_back(ctx);
  return id;
}

void unpin_token(std::uint64_t token) {
  if (token == 0) return;
  Registry& r = reg();
  Releases rel;
  {
    std::lock_guard lock(r.mutex);
    auto it = r.tokens.find(token);
    if (it == r.tokens.end()) return;
    it->second.pins--;
    unref_locked(r, token, &rel);
  }
  run_releases(rel);
}

void graph_cloned(CUgraph original, CUgraph clone) { graph_embedded(clone, original); }

void graph_embedded(CUgraph parent, CUgraph child) {
  if (parent == nullptr || child == nullptr) return;
  Registry& r = reg();
  std::lock_guard lock(r.mutex);
  auto it = r.graphs.find(child);
  if (it == r.graphs.end() || it->second.empty()) return;
  const Set tokens = it->second;
  add_all_locked(r, r.graphs[parent], tokens);
}

void graph_instantiated(CUgraphExec exec, CUgraph graph) { exec_updated(exec, graph); }

void exec_updated(CUgraphExec exec, CUgraph graph) {
  if (exec == nullptr || graph == nullptr) return;
  Registry& r = reg();
  std::lock_guard lock(r.mutex);
  auto it = r.graphs.find(graph);
  if (it == r.graphs.end() || it->second.empty()) return;
  const Set tokens = it->second;
  add_all_locked(r, r.execs[exec], tokens);
}

void graph_destroyed(CUgraph graph) { drop_entry(reg().graphs, graph); }
void exec_destroyed(CUgraphExec exec) { drop_entry(reg().execs, exec); }

GraphOwnerCounts graph_owner_counts() {
  Registry& r = reg();
  std::lock_guard lock(r.mutex);
  GraphOwnerCounts c;
  c.tokens = r.tokens.size();
  for (const auto& [g, set] : r.graphs) c.graphs += set.empty() ? 0 : 1;
  for (const auto& [e, set] : r.execs) c.execs += set.empty() ? 0 : 1;
  return c;
}

const char* check_graph_owners() {
  Registry& r = reg();
  std::lock_guard lock(r.mutex);
  std::unordered_map<std::uint64_t, int> expect;
  for (const auto& [id, t] : r.tokens) {
    if (t.count <= 0) return "a token with nothing keeping it is still listed";
    expect[id] += (t.capturing ? 1 : 0) + t.pins;
    for (std::uint64_t u : t.keeps) {
      if (r.tokens.count(u) == 0) return "a token keeps a union token that is gone";
      expect[u]++;
    }
  }
  for (const auto* map : {&r.graphs}) {
    for (const auto& [g, set] : *map)
      for (std::uint64_t t : set) {
        if (r.tokens.count(t) == 0) return "a graph names a token that is gone";
        expect[t]++;
      }
  }
  for (const auto& [e, set] : r.execs)
    for (std::uint64_t t : set) {
      if (r.tokens.count(t) == 0) return "an executable graph names a token that is gone";
      expect[t]++;
    }
  for (const auto& [id, t] : r.tokens)
    if (expect[id] != t.count) return "a token's count differs from what names it";
  return nullptr;
}

}  // namespace cachalloc::shim
