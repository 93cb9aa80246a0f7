#!/usr/bin/env python3
"""Finds include cycles between the modules of src/.

A module is a path under src/ without its extension: io/pickle.hpp and io/pickle.cpp are the
module io/pickle. Module A depends on module B when a file of A has `#include "..."` naming a
file of B (resolved against src/, then against the including file's folder; system and
third-party headers are ignored). A cycle means two modules need each other: split them.

usage: scripts/check_includes.py [SRC_DIR]   (default: the src/ next to this script)
       scripts/check_includes.py --self-test
Prints "no include cycles among N modules" and exits 0, or prints each cycle with the include
lines that close it and exits 1.
"""
import os
import re
import sys
import tempfile

EXTENSIONS = (".hpp", ".h", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def module_of(rel_path):
    return os.path.splitext(rel_path)[0].replace(os.sep, "/")


def include_graph(src):
    """{module: {dependency: (file, line number, text)}} over the files under src."""
    files = []
    for folder, _, names in os.walk(src):
        files += [os.path.relpath(os.path.join(folder, n), src) for n in names if n.endswith(EXTENSIONS)]
    graph = {module_of(f): {} for f in files}
    for f in sorted(files):
        with open(os.path.join(src, f), encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                for candidate in (m.group(1), os.path.join(os.path.dirname(f), m.group(1))):
                    candidate = os.path.normpath(candidate)
                    if os.path.isfile(os.path.join(src, candidate)):
                        target = module_of(candidate)
                        if target != module_of(f):
                            graph[module_of(f)].setdefault(target, (f, number, line.strip()))
                        break
    return graph


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def cycle_path(graph, component):
    """One closed path through a component, as a list of modules (first == last)."""
    members = set(component)
    start = component[0]
    parent, queue = {start: None}, [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node]):
            if child == start:
                path = [node]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])
                return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, node, start]
            if child in members and child not in parent:
                parent[child] = node
                queue.append(child)
    return component + [component[0]]


def report(graph):
    found = cycles(graph)
    if not found:
        print(f"no include cycles among {len(graph)} modules")
        return 0
    for component in found:
        path = cycle_path(graph, component)
        print("include cycle: " + " -> ".join(path))
        for a, b in zip(path, path[1:]):
            f, number, text = graph[a][b]
            print(f"  {f}:{number}: {text}")
    return 1


def self_test():
    with tempfile.TemporaryDirectory() as src:
        def write(path, *includes):
            os.makedirs(os.path.join(src, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(src, path), "w") as fh:
                fh.write("".join(f'#include "{i}"\n' for i in includes) + "#include <vector>\n")
        write("a/x.hpp")
        write("a/x.cpp", "a/x.hpp", "b/y.hpp")
        write("b/y.hpp", "a/x.hpp")
        write("b/z.cpp", "y.hpp")  # resolved against its own folder
        graph = include_graph(src)
        assert graph["b/z"] == {"b/y": ("b/z.cpp", 1, '#include "y.hpp"')}, graph
        assert cycles(graph) == [["a/x", "b/y"]], cycles(graph)
        assert report(graph) == 1
        write("b/y.hpp")  # the header no longer includes a/x: no cycle left
        assert cycles(include_graph(src)) == []
    print("self-test passed")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    src = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    if not os.path.isdir(src):
        print(f"no such folder: {src}", file=sys.stderr)
        return 2
    return report(include_graph(src))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
