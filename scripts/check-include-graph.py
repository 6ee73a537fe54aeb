#!/usr/bin/env python3
"""check-include-graph.py — the layering of core/, core/obs/ and shim/.

Fails (exit 1) when
  * the modules of core/, core/obs/ and shim/ depend on each other in a
    circle, or
  * a file of core/ (core/obs/ included) includes a file of shim/ or calls a
    function that shim/ defines.

A module is a file's path without its ending: shim/host_ops.h and
shim/host_ops.cpp are the module shim/host_ops.  Module A depends on module B
when a file of A
  * includes a header of B (#include "...", found as the compiler finds it:
    beside the including file, then core/, core/obs/, shim/, include/), or
  * calls or names a function of cachalloc's own by its link name (a
    cachalloc_* function defined at global scope, not static) that a file of
    B defines: the extern "C" functions of include/cachalloc.h, or a global
    function declared anywhere: the call no #include of B shows
    (include/cachalloc.h itself is no module: each of its functions belongs
    to the module that defines it).  The driver's, cudart's and libc's names
    that shim/ defines to interpose (cuMemAlloc_v2, cudaMalloc, dlsym) are
    not followed: naming them means the API, not the wrapper.
A header implemented by a .cpp file of another name is not followed to that
file (such a .cpp file is a module of its own), except through the
cachalloc_* functions it declares.  KNOWN_BACK_ARROWS lists the few arrows
left out of the graph, each with its reason.

Usage: check-include-graph.py [SOURCE_ROOT]   (default: this script's ../)
Python 3 standard library only.  Run by the unit suite (tests/unit/meson.build).
"""
import os
import re
import sys

SCOPES = ["core", "core/obs", "shim"]

# Back arrows known and not yet turned around, each (from, to): reason.
# Each makes a circle with the arrows the other way and is left out of the
# graph; one that is no longer there fails the check, so that this list
# only shrinks.  Empty since issue 38 item 4 turned the last three (start-up
# hands process_state its upper steps, start_up.h; the context registry
# gets its creation hooks the same way).
KNOWN_BACK_ARROWS = {}
INCLUDE_PATH = ["core", "core/obs", "shim", "include"]

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
KEYWORDS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "alignof", "decltype", "static_assert",
            "noexcept", "defined", "operator", "throw", "new", "delete", "using", "requires"}


def strip_code(text):
    """Comments, string and character literals and preprocessor lines blanked
    (newlines kept, so offsets still give line numbers); extern "C" becomes
    the marker extern_C."""
    text = re.sub(r'extern\s+"C"', 'extern_C  ', text)
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):  # 1'000 is a digit separator
            if c == '"' and i > 0 and text[i - 1] == "R":  # raw string R"d(...)d"
                k = text.find("(", i)
                delim = ")" + text[i + 1:k] + '"'
                j = text.find(delim, k)
                j = n if j < 0 else j + len(delim)
            else:
                j = i + 1
                while j < n and text[j] != c and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                j += 1
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + c)
            i = j
        elif c == "#" and (i == 0 or text[text.rfind("\n", 0, i) + 1:i].strip() == ""):
            j = i
            while True:  # a directive ends at a newline not escaped by a backslash
                j = text.find("\n", j)
                if j < 0:
                    j = n
                    break
                if text[j - 1] != "\\":
                    break
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def global_definitions(code):
    """(name, offset) of every function defined at global scope (outside any
    named or anonymous namespace, class or function; extern "C" blocks are
    global), not static and not qualified (Class::f, ns::f)."""
    found = []
    stack = []  # 'ns', 'extern', 'other'
    start = 0  # where the current declaration began
    i = 0
    while i < len(code):
        c = code[i]
        if c in ";":
            start = i + 1
        elif c == "{":
            head = code[start:i]
            if re.search(r"\bnamespace\b[\w\s:]*$", head):
                stack.append("ns")
            elif re.search(r"\bextern_C\s*$", head):
                stack.append("extern")
            else:
                if all(s == "extern" for s in stack):
                    h = re.sub(r"__attribute__\s*\(\(.*?\)\)", " ", head, flags=re.S)
                    m = re.match(r"([^(=]*?)\b(\w+)\s*\(", h, re.S)
                    if m and not re.search(r"(::|~)\s*$", m.group(1)) and m.group(2) not in KEYWORDS and \
                            not re.search(r"\b(static|struct|class|union|enum|typedef)\b", m.group(1)) and \
                            re.search(r"\)[\s\w&>:<*,-]*$", h):
                        found.append((m.group(2), start + len(h[:m.start(2)])))
                stack.append("other")
            start = i + 1
        elif c == "}":
            if stack:
                stack.pop()
            start = i + 1
        i += 1
    return found


class Source:
    def __init__(self, root, rel):
        self.rel = rel
        self.module = os.path.splitext(rel)[0]
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            self.text = f.read()
        self.code = strip_code(self.text)


def resolve(root, including, name):
    for d in [os.path.dirname(including)] + INCLUDE_PATH:
        p = os.path.normpath(os.path.join(d, name))
        if os.path.isfile(os.path.join(root, p)):
            return p
    return None


def sccs(graph):
    """Tarjan's strongly connected components of {node: {succ: evidence}}."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    sources = []
    for d in SCOPES:
        for name in sorted(os.listdir(os.path.join(root, d))):
            if name.endswith((".h", ".cpp")):
                sources.append(Source(root, d + "/" + name))
    if not sources:
        print("check-include-graph: no sources under " + root)
        return 1

    # Functions by link name: where each is defined.
    defined_in = {}
    for s in sources:
        if s.rel.endswith(".cpp"):
            for name, _ in global_definitions(s.code):
                if name.startswith("cachalloc_"):
                    defined_in.setdefault(name, set()).add(s.module)
    link_names = {n: mods for n, mods in defined_in.items() if len(mods) == 1}
    call_re = re.compile(r"(?<![\w.>:~])(" + "|".join(sorted(map(re.escape, link_names))) + r")\b") \
        if link_names else None

    graph = {}  # module -> {module: "file:line what"}
    problems = []

    known_seen = set()

    def edge(src, dst, why):
        if (src.module, dst) in KNOWN_BACK_ARROWS:
            known_seen.add((src.module, dst))
        elif src.module != dst:
            graph.setdefault(src.module, {}).setdefault(dst, why)
            if src.rel.startswith("core/") and dst.startswith("shim/"):
                problems.append("core/ depends on shim/: " + why)

    for s in sources:
        graph.setdefault(s.module, {})
        for m in INCLUDE_RE.finditer(s.text):
            target = resolve(root, s.rel, m.group(1))
            if target is None or target.startswith("include/"):
                continue  # system, generated (stream_calls.inc) or the public header
            edge(s, os.path.splitext(target)[0],
                 "%s:%d includes %s" % (s.rel, line_of(s.text, m.start()), target))
        if call_re is not None:
            for m in call_re.finditer(s.code):
                (owner,) = link_names[m.group(1)]
                edge(s, owner, "%s:%d calls %s(), defined in %s" % (s.rel, line_of(s.code, m.start()), m.group(1),
                                                                    owner))

    for a, b in sorted(set(KNOWN_BACK_ARROWS) - known_seen):
        problems.append("%s -> %s is in KNOWN_BACK_ARROWS but no longer there: take it out of the list" % (a, b))

    for comp in sccs(graph):
        if len(comp) < 2:
            continue
        members = set(comp)
        lines = ["circle among %s:" % ", ".join(comp)]
        for a in comp:
            for b, why in sorted(graph[a].items()):
                if b in members:
                    lines.append("    %s -> %s: %s" % (a, b, why))
        problems.append("\n".join(lines))

    for p in problems:
        print("check-include-graph: " + p)
    edges = sum(len(v) for v in graph.values())
    if problems:
        print("check-include-graph: FAILED (%d modules, %d dependencies, %d problem(s))" % (len(graph), edges,
                                                                                          len(problems)))
        return 1
    known = " but through the %d known back arrows" % len(KNOWN_BACK_ARROWS) if KNOWN_BACK_ARROWS else ""
    print("check-include-graph: ok (%d modules, %d dependencies, %d functions called by link name; no circle%s, "
          "core/ does not reach shim/)" % (len(graph), edges, len(link_names), known))
    return 0


if __name__ == "__main__":
    sys.exit(main())
