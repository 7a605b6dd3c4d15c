#!/usr/bin/env python3
"""Refuses an #include of a higher layer's header (ctest `layering_includes`).

Layers, bottom to top (docs/architecture.md):

    core < backend < nn < io < data, dist < train < app

A file may include headers of its own layer and of any layer below; `data` and
`dist` sit side by side (neither includes the other). A file's layer and a
header's layer both come from their path: src/<layer>/..., include/resnet_ddp/<layer>/...
(the headers directly in include/resnet_ddp/ and include/resnet_ddp/math/ are core),
and the CUDA kernels (kernels/) are backend.

Test equipment (tests/: the emulated CUDA device in tests/cuda_emu, the fuzz targets
in tests/fuzz, fixtures) is below no layer: a file in src/, include/ or kernels/
never includes a header from tests/, whatever the exceptions say, so the
programs users run never compile test code.

The same rule holds for the libraries: each rd_component(NAME DIRS src/<layer>...
DEPS ...) in CMakeLists.txt may depend only on components of its own layer or below.

Known exceptions are edges "from-layer -> to-layer: reason" in
tools/layering_allow.txt; each must still be needed (an unused one fails too, so
the list only shrinks).

    tools/check_layering.py [--root DIR]
"""
import argparse
import os
import re
import sys

ORDER = {"core": 0, "backend": 1, "nn": 2, "io": 3, "data": 4, "dist": 4, "train": 5, "app": 6}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCE_DIRS = ("src", "include/resnet_ddp", "kernels")
SUFFIXES = (".h", ".hpp", ".cuh", ".cpp", ".cu")


def layer_of(rel):
    """Layer of a repository-relative path, or None (not layered: tests, tools...)."""
    parts = rel.split("/")
    if parts[0] == "kernels":
        return "backend"
    if parts[0] == "src" and len(parts) > 2:
        return parts[1] if parts[1] in ORDER else None
    if parts[0] == "src":
        return None
    if parts[:2] == ["include", "resnet_ddp"]:
        if len(parts) == 3 or parts[2] == "math":
            return "core"
        return parts[2] if parts[2] in ORDER else None
    return None


def resolve(root, including_rel, header):
    """Repository-relative path of an included header, or None when not ours."""
    here = os.path.dirname(including_rel)
    for base in (here, "include", "src", "", "tests"):
        cand = os.path.normpath(os.path.join(base, header))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def component_edges(root):
    """(component, its layer, dependency, its layer) for each rd_component's DEPS."""
    path = os.path.join(root, "CMakeLists.txt")
    if not os.path.exists(path):
        return []
    text = re.sub(r"#[^\n]*", "", open(path).read())
    layers, deps = {}, {}
    for m in re.finditer(r"rd_component\(\s*(\w+)([^)]*)\)", text):
        words = m.group(2).split()
        section, dirs = None, []
        for w in words:
            if w in ("DIRS", "DEPS", "EXTRA", "EXCLUDE"):
                section = w
            elif section == "DIRS":
                dirs.append(w)
            elif section == "DEPS" and w.startswith("rd_"):
                deps.setdefault(m.group(1), []).append(w)
        found = {layer_of(d + "/x.cpp") for d in dirs} - {None}
        if len(found) == 1:
            layers[m.group(1)] = found.pop()
    return [(c, layers[c], d, layers[d]) for c in deps for d in deps[c] if c in layers and d in layers]


def load_allowed(path):
    allowed = {}
    if not os.path.exists(path):
        return allowed
    for n, line in enumerate(open(path), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"^(\w+)\s*->\s*(\w+)\s*:\s*(\S.*)$", line)
        if not m:
            sys.exit(f"{path}:{n}: expected 'from -> to: reason', got '{line}'")
        allowed[(m.group(1), m.group(2))] = m.group(3)
    return allowed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--allow", help="allowed edges (default: tools/layering_allow.txt)")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    allowed = load_allowed(a.allow or os.path.join(root, "tools", "layering_allow.txt"))
    used, bad = set(), []
    for top in SOURCE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SUFFIXES):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                mine = layer_of(rel)
                if mine is None:
                    continue
                for n, line in enumerate(open(os.path.join(root, rel), errors="replace"), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = resolve(root, rel, m.group(1))
                    if target and target.split("/")[0] == "tests":
                        bad.append(f"{rel}:{n}: includes {target}, test equipment (tests/), from shipped code")
                        continue
                    theirs = layer_of(target) if target else None
                    if theirs is None or theirs == mine:
                        continue
                    if ORDER[theirs] < ORDER[mine]:
                        continue
                    if (mine, theirs) in allowed:
                        used.add((mine, theirs))
                        continue
                    bad.append(f"{rel}:{n}: {mine} includes {target} ({theirs}), a layer above or beside it")
    for comp, mine, dep, theirs in component_edges(root):
        if theirs == mine or ORDER[theirs] < ORDER[mine]:
            continue
        if (mine, theirs) in allowed:
            used.add((mine, theirs))
            continue
        bad.append(f"CMakeLists.txt: {comp} ({mine}) depends on {dep} ({theirs}), a layer above or beside it")
    stale = [f"{k[0]} -> {k[1]}" for k in allowed if k not in used]
    for b in bad:
        print(b)
    for s in stale:
        print(f"tools/layering_allow.txt: '{s}' is no longer needed: remove it")
    if bad or stale:
        print(f"layering: {len(bad)} include(s) reach up, {len(stale)} stale exception(s); "
              "layers: core < backend < nn < io < data, dist < train < app")
        return 1
    print(f"layering: ok ({len(used)} allowed exception(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
