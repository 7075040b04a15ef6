#!/usr/bin/env python3
"""Import cycles between the files of a Rust crate (default: habana-mock/src).

Parses `use crate::`, `use super::`, `use self::`, bare `use child::` and inline `crate::x::` /
`super::x::` / `child::x` paths (comments and doc comments stripped), resolves each to the file of the
deepest module it names, and prints the strongly connected components of more than one file
(Tarjan). `mod x;` declarations are not edges; `pub use` re-exports are. A file's references
to itself (e.g. `use super::*` in its test module) are ignored.

Usage: ci/mock_scc.py [SRC_DIR] [--edges]    exit status 0 always (a report, not a gate).
"""

import os
import re
import sys


def module_path(rel):
    """File path relative to src -> module path tuple ('hccl', 'comm'); lib.rs -> ()."""
    parts = rel[:-3].split("/")
    if parts[-1] in ("lib", "main"):
        parts = parts[:-1]
    elif parts[-1] == "mod":
        parts = parts[:-1]
    return tuple(parts)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def inline_mods(text):
    """Spans (start, end, name) of inline `mod name { ... }` blocks, outermost first."""
    spans = []
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += text[i] == "{"
            depth -= text[i] == "}"
            i += 1
        spans.append((m.start(), i, m.group(1)))
    return spans


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (enough for module resolution)."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, inner = m.group(1), m.group(2)
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    if cur:
        items.append(cur)
    out = []
    for it in items:
        out += [prefix + x for x in expand_use(it)]
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    show_edges = "--edges" in sys.argv
    src = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "habana-mock", "src")
    src = os.path.normpath(src)
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs"):
                rel = os.path.relpath(os.path.join(root, n), src)
                files[module_path(rel)] = rel
    children = {}
    for m in files:
        if m:
            children.setdefault(m[:-1], set()).add(m[-1])

    def resolve(cur, path):
        segs = [s for s in path.split("::") if s]
        if not segs:
            return None
        if segs[0] == "crate":
            base, segs = (), segs[1:]
        elif segs[0] in ("super", "self"):
            base = cur
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    base = base[:-1]
                segs = segs[1:]
        elif segs[0] in children.get(cur, ()):
            base = cur
        else:
            return None  # an external crate or std
        best = base
        for s in segs:
            if base + (s,) in files:
                base = base + (s,)
                best = base
            else:
                break
        return files.get(best)

    edges = {f: set() for f in files.values()}
    for mod, rel in files.items():
        text = strip_comments(open(os.path.join(src, rel), encoding="utf-8").read())
        spans = inline_mods(text)

        def scope(pos):
            inner = [name for (a, b, name) in spans if a <= pos < b]
            return mod + tuple(inner)

        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            paths += [(m.start(), x) for x in expand_use(m.group(1))]
        paths += [(m.start(), m.group(1)) for m in re.finditer(r"\b((?:crate|super)(?:::\w+)+)", text)]
        # Bare paths through a child module (`ffi::syn_initialize` in lib.rs); resolve() drops
        # those whose first segment is not a child module of the scope.
        paths += [(m.start(), m.group(1)) for m in re.finditer(r"(?<![:\w$])([a-z_]\w*(?:::[\w$]+)+)", text)]
        for pos, p in paths:
            p = re.sub(r"\s+as\s+\w+$", "", p)
            target = resolve(scope(pos), p)
            if target and target != rel:
                edges[rel].add(target)

    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
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
            sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    cyclic = sorted((c for c in sccs if len(c) > 1), key=len, reverse=True)
    print(f"{len(files)} files, {sum(len(e) for e in edges.values())} edges, {len(cyclic)} cycle(s)")
    for c in cyclic:
        print(f"SCC of {len(c)}: {' '.join(c)}")
    if show_edges:
        for f in sorted(edges):
            print(f"{f} -> {' '.join(sorted(edges[f]))}")


if __name__ == "__main__":
    main()
