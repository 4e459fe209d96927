#!/usr/bin/env python3
"""check_layers.py — holds libcoll's (or libtrain's) code to the layers of its layers.rules.

    check_layers.py SOURCE_ROOT BUILD_ROOT [--tree libcoll|libtrain] [--rules FILE] [--graph]
                    [--expect-broken TEXT]

--tree picks the library (libcoll by default) and with it the default rules file
(TREE/layers.rules), the sources (TREE/, without its test/ and tools/ folders) and the
objects (the library's own, and for libtrain coll-train's and the CUDA module's).

Two graphs, both read from what the build really uses:
  includes  every #include "x.h" of every .c/.h/.cu/.cuh under libcoll/,
            matched to the file meson's include folders would pick (the including
            file's own folder first, then the folders of libcoll/meson.build's
            include_directories, then libcoll/transport/);
  calls     every object file of libcoll.so (and of the transport archive, and the nvcc
            objects): a symbol it needs (nm: U) that another object defines (T, D, B, R)
            is an arrow from the first object's source to the second's.  So a call, a
            function pointer taken, or a global read all count; a call through a pointer
            the caller was handed does not.
Each arrow between two layers must point down (or be an `allow`), and no arrow may match
a `never` (unless an `allow` names it too: a never's one exception, with its reason).  Prints every broken rule with the file, the header or the symbols; exits 1 if
there is one.  --graph prints every arrow between layers as well.  --expect-broken TEXT
turns the answer round, for the check of the check: exit 0 only if some broken rule's
line contains TEXT (a rules file that breaks on purpose must be caught).

Must never: build anything, or pass when it read nothing (it fails when it finds no
sources or no objects).
"""
import os
import re
import subprocess
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_rules(path):
    layers, shared, never, allow = [], [], [], []
    for raw in open(path):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("never") and \
            not raw.lstrip().startswith("allow") else raw.strip()
        if not line or line.startswith("#"):
            continue
        word = line.split()
        if word[0] == "layer":
            layers.append((word[1], word[2:]))
        elif word[0] == "shared":
            shared += word[1:]
        elif word[0] in ("never", "allow"):
            (never if word[0] == "never" else allow).append((word[1], word[2], " ".join(word[3:])))
        else:
            sys.exit(f"{path}: cannot read '{line}'")
    return layers, shared, never, allow


def layer_of(path, layers):
    best, best_len = None, -1
    for i, (name, prefixes) in enumerate(layers):
        for p in prefixes:
            if (path == p or path.startswith(p + "/")) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def sources(root, tree):
    out = []
    for d, subdirs, files in os.walk(os.path.join(root, tree)):
        if os.path.relpath(d, root) == tree:
            subdirs[:] = [x for x in subdirs if x not in ("test", "tools")]
        for f in files:
            if f.endswith((".c", ".h", ".cu", ".cuh")):
                out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


def include_dirs(root, tree):
    """TREE/meson.build's include_directories('.', 'include', ...) (libcoll_inc or train_inc),
    then, for libcoll, libcoll/transport/."""
    text = open(os.path.join(root, tree, "meson.build")).read()
    var = "libcoll_inc" if tree == "libcoll" else "train_inc"
    m = re.search(var + r"\s*=\s*include_directories\(([^)]*)\)", text)
    dirs = [os.path.normpath(os.path.join(tree, d)) for d in re.findall(r"'([^']+)'", m.group(1))] if m else []
    return dirs + (["libcoll/transport"] if tree == "libcoll" else [])


def resolve(root, src, name, dirs):
    for d in [os.path.dirname(src)] + dirs:
        cand = os.path.normpath(os.path.join(d, name))
        if os.path.exists(os.path.join(root, cand)):
            return cand
    return None  # a system header, or generated (coll_config.h)


def objects(build, tree="libcoll"):
    """(object path, source path relative to the source root) for every object file."""
    if tree == "libtrain":
        return train_objects(build)
    out = []
    for d, _, files in os.walk(build):
        for f in files:
            if not f.endswith(".o"):
                continue
            p = os.path.join(d, f)
            rel = os.path.relpath(p, build)
            if rel.startswith("libcoll.so") and f.startswith("libcoll_"):
                # libcoll.so.0.1.0.p/libcoll_algo_ring.c.o -> libcoll/algo/ring.c
                stem = f[len("libcoll_"):-len(".o")]
                folder, _, rest = stem.partition("_")
                out.append((p, f"libcoll/{folder}/{rest}"))
            elif "libcoll_transport.a.p" in rel:
                out.append((p, "libcoll/transport/" + f[:-len(".o")]))
            elif rel.startswith("libcoll" + os.sep) and os.sep not in rel[len("libcoll/"):] and f.endswith("kernels.o"):
                out.append((p, f"libcoll/cuda/{f[:-len('.o')]}.cu"))  # the nvcc objects
    return out


def train_objects(build):
    """libtrain's objects: libtrain.a's, coll-train's, the CUDA module's (meson names an
    object for libtrain/parallel/tp.c parallel_tp.c.o) and the nvcc object."""
    out = []
    top = os.path.join(build, "libtrain")
    for d, _, files in os.walk(top):
        rel = os.path.relpath(d, top)
        if rel.split(os.sep)[0] not in ("libtrain.a.p", "coll-train.p", "libtrain_cuda.so.p", "."):
            continue
        for f in files:
            if not f.endswith(".o"):
                continue
            if rel == ".":
                if f == "layers_cuda.o":
                    out.append((os.path.join(d, f), "libtrain/model/layers_cuda.cu"))
                continue
            folder, _, rest = f[:-len(".o")].partition("_")
            out.append((os.path.join(d, f), f"libtrain/{folder}/{rest}"))
    return out


def symbols(obj):
    res = subprocess.run(["nm", "--defined-only", obj], capture_output=True, text=True)
    undef = subprocess.run(["nm", "-u", obj], capture_output=True, text=True)
    defined = {l.split()[-1] for l in res.stdout.splitlines() if len(l.split()) == 3 and l.split()[1] in "TDBRVW"}
    needed = {l.split()[-1] for l in undef.stdout.splitlines() if l.split()}
    return defined, needed


def main():
    args, skip = [], False
    for a in sys.argv[1:]:  # positional arguments: those that no option takes
        if skip:
            skip = False
        elif a in ("--rules", "--expect-broken", "--tree"):
            skip = True
        elif not a.startswith("--"):
            args.append(a)
    graph = "--graph" in sys.argv
    root, build = args[0], args[1]
    tree = sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv else "libcoll"
    rules = os.path.join(root, tree, "layers.rules")
    if "--rules" in sys.argv:
        rules = sys.argv[sys.argv.index("--rules") + 1]
    layers, shared, never, allow = read_rules(rules)
    names = [n for n, _ in layers]
    srcs = sources(root, tree)
    objs = objects(build, tree)
    if not srcs or not objs:
        print(f"check_layers: read {len(srcs)} sources and {len(objs)} objects: nothing to check")
        return 1

    arrows = {}  # (from file, to file) -> set of what ("#include x" or symbol names)
    dirs = include_dirs(root, tree)
    for s in srcs:
        for name in INCLUDE.findall(open(os.path.join(root, s), errors="replace").read()):
            t = resolve(root, s, name, dirs)
            if t and t != s:
                arrows.setdefault((s, t), set()).add(f"#include \"{name}\"")
    owner = {}
    need = {}
    for obj, src in objs:
        d, u = symbols(obj)
        for sym in d:
            owner.setdefault(sym, src)
        need[src] = u
    for src, u in need.items():
        for sym in u:
            t = owner.get(sym)
            if t and t != src:
                arrows.setdefault((src, t), set()).add(sym)

    def matches(path, spec):
        return path == spec or path.startswith(spec + "/") or layer_name(path) == spec

    def layer_name(path):
        i = layer_of(path, layers)
        return names[i] if i is not None else None

    broken = []
    for (a, b), what in sorted(arrows.items()):
        la, lb = layer_of(a, layers), layer_of(b, layers)
        if b in shared or os.path.basename(b) in shared:
            # shared headers: allowed everywhere, unless a `never` names them
            up = False
        else:
            up = la is not None and lb is not None and lb < la
        tag = f"{a} ({layer_name(a)}) -> {b} ({layer_name(b)}): {', '.join(sorted(what))}"
        allowed = any(matches(a, f) and matches(b, t) for f, t, _ in allow)
        for f, t, why in never:
            if matches(a, f) and matches(b, t) and not allowed:
                broken.append(f"never: {tag}\n    rule: never {f} {t} — {why}")
        if up:
            if allowed:
                continue
            broken.append(f"up: {tag}")
        elif graph and la != lb:
            print(f"  {tag}")
    for line in broken:
        print(line)
    print(f"check_layers: {len(srcs)} sources, {len(objs)} objects, {len(arrows)} arrows, "
          f"{len(broken)} broken")
    if "--expect-broken" in sys.argv:
        want = sys.argv[sys.argv.index("--expect-broken") + 1]
        caught = any(want in line for line in broken)
        print(f"check_layers: a broken rule naming '{want}' was {'caught' if caught else 'NOT caught'}")
        return 0 if caught else 1
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
