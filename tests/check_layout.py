#!/usr/bin/env python3
"""check_layout.py - the folder layering of docs/architecture.md, enforced.

Reads every `#include "..."` of every C and CUDA file under core/, cli/,
server/, backends/ and config/, resolves it as the compiler does (the
including file's folder, then the include directories meson gives), maps
both ends to their part (core/base, core/run, cli, server, ...) and checks
the edge against LAYERS and EXTRA below. Fails naming the file, the line
and the include for every edge that is not allowed, and for any cycle in
the graph of parts. Run by `meson test` (check_layout); standard library
only. Before the tree it checks itself on a small made-up tree with an
upward include and a cycle, so a check that has stopped seeing anything
fails too.

With --archives, it checks the built objects too: every symbol an object
of one core/ folder's archive (libcanopy_<folder>.a) takes from another
folder's must come from a folder below, per `nm`; LINK_EXCEPTIONS names
the only references allowed upward.

With --calls, it checks calls between the files of one folder: from the
build's compile_commands.json it finds the object of every C and CUDA file
under core/, cli/, server/, backends/, config/ and tools/, reads which
symbols each defines and which it takes from elsewhere (`nm`), and fails,
naming the files and the symbols, on any cycle of files within a folder
(a file may not call a file of its folder that calls it back, directly or
round a longer circle). CALL_CYCLE_EXCEPTIONS names the folders whose
circle is known and not yet cut (none now); it, too, is checked on a
made-up case first, and an exception whose folder has no circle any more
fails too. server/'s files are also checked against SERVER_LAYERS: no
call from a file of one layer into a file of a layer above it.

usage: check_layout.py [SOURCE_ROOT]
       check_layout.py --archives LIBCANOPY_BASE.a ... LIBCANOPY_FAMILIES.a
       check_layout.py --calls BUILD_ROOT [SOURCE_ROOT]
"""
import json
import os
import re
import subprocess
import sys
import tempfile

# core/'s subsystems, lowest first: a file may include headers of its own
# folder and of the folders before it, never after. core/public is the
# public face (canopy_core.h) and the backend interface (backend.h).
LAYERS = [
    "core/public",   # canopy_core.h, backend.h
    "core/base",     # err.c, util.c: what everything uses
    "core/input",    # trees, vocabularies, lexicons, safetensors
    "core/cell",     # op IR, compiler, memory layout, PQ-tree
    "core/model",    # models, the family registry, instances
    "core/sched",    # frontier, heuristics, FSM, plans, graph sets
    "core/run",      # runs: graph, arena, batches, execution
    "core/families",  # the model families: build and execute runs
]

# Edges outside core/'s order, each with its reason.
EXTRA = {
    # The backends implement core/backend.h and see the public header only.
    "backends": {"core/public"},
    # Configuration keys name core's limits (canopy_core.h).
    "config": {"core/public"},
    # The commands (run, model, policy) and main.c: core's public header,
    # the backends' registry, the configuration table (and its flag
    # helpers, flags.h), and the daemon's entry (server/serve.h, for
    # main.c to dispatch `canopy serve`). Never the daemon's insides.
    "cli": {"core/public", "backends", "config", "server/public"},
    # The daemon: core's public header, backends, configuration (and the
    # flag helpers it shares with the commands). Never cli/.
    "server": {"core/public", "backends", "config", "server/public"},
    # Every internal header at once, for tests/ only (nothing in the tree
    # may include it: no part lists core/internal here).
    "core/internal": set(LAYERS),
}

# References from a lower folder's objects to a higher folder's symbols that
# are allowed, by (folder, symbol prefix): model/registry.c lists the family
# descriptors (data, defined in core/families/) by extern declaration; it
# never includes families/ and calls no family code itself.
LINK_EXCEPTIONS = {("core/model", "cn__fam_")}

# Folders whose files still call each other in a circle, each with its
# reason; --calls fails on a circle in any other folder, and on an entry
# here whose folder has none any more (delete the entry then).
CALL_CYCLE_EXCEPTIONS = {}

# server/'s layers (docs/architecture.md, "server/ in layers"), top first:
# a file takes symbols only from files of its own layer or a layer below.
# "base" files (logs, metrics, systemd, the body scan) call no other
# server file and may be called from every layer. A server file that is in
# none fails the check: a new file is placed here when it is added.
SERVER_LAYERS = [
    ("entry", ["serve.c"]),
    ("handlers", ["http.c", "routes.c", "infer.c", "parse_time.c", "limits.c",
                  "bigparse.c", "kserve.c", "repo.c", "repo_control.c",
                  "repo_report.c",
                  "repo_dirs.c",
                  "kserve_ext.c"]),
    ("work", ["window.c", "job_queue.c", "worker.c", "decode.c", "warmup.c",
              "learned_policy.c", "answer_parts.c", "kserve_answer.c"]),
    ("request", ["request.c", "versions.c"]),
    ("net", ["listen.c", "conn_parse.c", "conn.c", "conn_accept.c",
             "grpc.c", "grpc_accept.c", "grpc_call.c",
             "grpc_request.c",
             "grpc_service.c", "grpc_service.pb-c.c"]),
    ("base", ["log.c", "metrics.c", "metrics_text.c", "notify.c", "bodyscan.c",
              "encoding.c", "numtext.c"]),
]

# Where meson looks for a quoted include after the file's own folder
# (meson.build `inc`, server/ and tests/ add backends/ and config/).
INCLUDE_DIRS = [".", "core", "backends", "config"]
SCAN = ["core", "cli", "server", "backends", "config"]
EXTS = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def part_of(rel):
    """The part a file (path relative to the root) belongs to."""
    p = rel.split("/")
    if p[0] == "core":
        if len(p) == 2:
            return "core/internal" if p[1] == "internal.h" else "core/public"
        return "core/" + p[1]
    if rel == "server/serve.h":
        return "server/public"  # the daemon's entry, cn_cmd_serve
    return p[0]


def allowed(src, dst):
    if src == dst:
        return True
    if src in LAYERS and dst in LAYERS:
        return LAYERS.index(dst) < LAYERS.index(src)
    return dst in EXTRA.get(src, set())


def scan(root):
    """Yields (file, line number, include text, resolved file or None)."""
    for top in SCAN:
        for d, _, names in os.walk(os.path.join(root, top)):
            for n in sorted(names):
                if not n.endswith(EXTS):
                    continue
                path = os.path.join(d, n)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for no, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        inc = m.group(1)
                        hit = None
                        for base in [d] + [os.path.join(root, i)
                                           for i in INCLUDE_DIRS]:
                            cand = os.path.normpath(os.path.join(base, inc))
                            # or meson's template of a generated header
                            # (cli/canopy_version.h.in: vcs_tag)
                            if not os.path.isfile(cand) and \
                                    os.path.isfile(cand + ".in"):
                                cand += ".in"
                            # or protoc-c's header of a .proto in the tree
                            # (server/grpc_service.proto: custom_target)
                            if not os.path.isfile(cand) and \
                                    cand.endswith(".pb-c.h") and \
                                    os.path.isfile(cand[:-7] + ".proto"):
                                cand = cand[:-7] + ".proto"
                            if os.path.isfile(cand):
                                hit = os.path.relpath(cand, root)
                                break
                        yield rel, no, inc, hit


def find_cycle(edges):
    """A cycle in {part: set(parts)} as a list, or None."""
    state, stack = {}, []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(edges.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state:
                c = visit(v)
                if c:
                    return c
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(edges):
        if u not in state:
            c = visit(u)
            if c:
                return c
    return None


def check(root):
    """The list of problems (strings) of the tree at root."""
    problems, edges = [], {}
    for rel, no, inc, hit in scan(root):
        if hit is None:
            problems.append(f'{rel}:{no}: #include "{inc}" resolves to no '
                            f'file of the tree')
            continue
        src, dst = part_of(rel), part_of(hit)
        if src != dst:
            edges.setdefault(src, set()).add(dst)
        if not allowed(src, dst):
            problems.append(f'{rel}:{no}: #include "{inc}" ({hit}): {src} '
                            f'may not include {dst} (docs/architecture.md)')
    cycle = find_cycle(edges)
    if cycle:
        problems.append("include cycle between parts: " + " -> ".join(cycle))
    return problems, edges


def self_test():
    """The check must see an upward include and a cycle in a made-up tree."""
    files = {
        "core/canopy_core.h": "",
        "core/base/base.h": '#include "canopy_core.h"\n',
        "core/sched/sched_api.h": '#include "base/base.h"\n',
        "core/sched/fsm.c": ('#include "sched/sched_api.h"\n'
                             '#include "run/run_api.h"\n'),
        "core/run/run_api.h": '#include "sched/sched_api.h"\n',
        "server/serve.c": '#include "canopy_core.h"\n',
        "cli/cmd_run.c": '#include "../server/serve_impl.h"\n',
        "server/serve_impl.h": "",
        "cli/main.c": '#include "server/serve.h"\n',
        "server/serve.h": "",
    }
    with tempfile.TemporaryDirectory() as t:
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(t, rel)), exist_ok=True)
            with open(os.path.join(t, rel), "w") as f:
                f.write(text)
        problems, _ = check(t)
    want = ["core/sched/fsm.c:2:", "cli/cmd_run.c:1:", "include cycle"]
    missed = [w for w in want if not any(p.startswith(w) or w in p
                                         for p in problems)]
    if missed or len(problems) != len(want):
        print("check_layout.py self-test failed: expected problems "
              f"{want}, got {problems}")
        return False
    return True


def nm_symbols(archive):
    """{object: (defined, undefined)} symbol sets of an archive, per nm -P."""
    out = subprocess.run(["nm", "-A", "-P", archive], capture_output=True,
                         text=True, check=True).stdout
    objs = {}
    for line in out.splitlines():
        where, sep, rest = line.rpartition("]: ")
        if not sep:
            continue
        obj = os.path.basename(where.rpartition("[")[2])
        f = rest.split()
        if len(f) < 2:
            continue
        d, u = objs.setdefault(obj, (set(), set()))
        if f[1] in "TDBRVWGS":
            d.add(f[0])
        elif f[1] == "U":
            u.add(f[0])
    return objs


def check_archives(archives):
    """Problems of the built core/ folders' archives (libcanopy_X.a)."""
    problems, defined, undefined = [], {}, []
    for a in archives:
        m = re.match(r"lib(?:canopy_)?(\w+)\.a$", os.path.basename(a))
        part = "core/" + m.group(1) if m else None
        if part not in LAYERS:
            problems.append(f"{a}: not the archive of a core/ folder")
            continue
        for obj, (d, u) in nm_symbols(a).items():
            for sym in d:
                defined[sym] = (part, obj)
            undefined.append((part, obj, u))
    seen = {p for p, _, _ in undefined}
    for part in LAYERS[1:]:
        if part not in seen:
            problems.append(f"no archive of {part} given: not checked")
    if not defined:
        problems.append("no symbol defined in the archives: nothing checked")
    for part, obj, u in undefined:
        for sym in sorted(u):
            if sym not in defined:
                continue
            dpart, dobj = defined[sym]
            if allowed(part, dpart) or any(
                    part == p and sym.startswith(x)
                    for p, x in LINK_EXCEPTIONS):
                continue
            problems.append(f"{part}/{obj}: uses {sym} of {dpart}/{dobj}: "
                            f"{part} may not call into {dpart}")
    return problems


# The folders --calls reads objects of (tools/ too: its programs are C).
CALL_SCAN = SCAN + ["tools"]
# nm's letters for a symbol an object defines (functions and data, never a
# weak or common one, which several objects may each hold).
NM_DEFINED = "TDBRGS"


def nm_parse(text):
    """(defined, undefined) symbol sets of one object, from `nm -P`."""
    d, u = set(), set()
    for line in text.splitlines():
        f = line.split()
        if len(f) < 2 or len(f[1]) != 1:
            continue
        if f[1] in NM_DEFINED:
            d.add(f[0])
        elif f[1] == "U":
            u.add(f[0])
    return d, u


def call_graph(symbols):
    """{folder: {file: {file it calls: [symbols]}}} from {file: (d, u)},
    counting only calls between two files of the same folder."""
    folders = {}
    for f in symbols:
        folders.setdefault(os.path.dirname(f), {}).setdefault(f, {})
    for folder, files in folders.items():
        owner = {}
        for f in files:
            for sym in symbols[f][0]:
                owner.setdefault(sym, f)
        for f in files:
            for sym in sorted(symbols[f][1]):
                g = owner.get(sym)
                if g is not None and g != f:
                    files[f].setdefault(g, []).append(sym)
    return folders


def circles(edges):
    """The strongly connected sets of more than one node of {u: {v: ..}}
    (Tarjan), each a sorted list, in sorted order."""
    index, low, on, stack, out = {}, {}, set(), [], []

    def visit(u):
        index[u] = low[u] = len(index)
        stack.append(u)
        on.add(u)
        for v in sorted(edges.get(u, ())):
            if v not in index:
                visit(v)
                low[u] = min(low[u], low[v])
            elif v in on:
                low[u] = min(low[u], index[v])
        if low[u] == index[u]:
            comp = []
            while True:
                v = stack.pop()
                on.discard(v)
                comp.append(v)
                if v == u:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for u in sorted(edges):
        if u not in index:
            visit(u)
    return sorted(out)


def check_calls(symbols, exceptions):
    """Problems (strings) and notes of the file-level call graph."""
    problems, notes = [], []
    folders = call_graph(symbols)
    for folder in sorted(exceptions):
        if folder not in folders:  # not built here (backends/cuda)
            notes.append(f"{folder}/: in CALL_CYCLE_EXCEPTIONS, no object "
                         "of it built: not checked")
    for folder, files in sorted(folders.items()):
        found = circles(files)
        if folder in exceptions:
            if not found:
                problems.append(f"{folder}/: no circle of calls any more: "
                                "delete its CALL_CYCLE_EXCEPTIONS entry")
            for comp in found:
                notes.append(f"{folder}/: known circle of {len(comp)} files "
                             f"({exceptions[folder]}): " +
                             ", ".join(os.path.basename(f) for f in comp))
            continue
        for comp in found:
            ring = set(comp)
            lines = [f"  {os.path.basename(f)} -> {os.path.basename(g)}: "
                     f"{', '.join(syms[:4])}{' ...' if len(syms) > 4 else ''}"
                     for f in comp for g, syms in sorted(files[f].items())
                     if g in ring]
            problems.append(f"{folder}/: {len(comp)} files call each other "
                            f"in a circle: {', '.join(comp)}\n" +
                            "\n".join(lines))
    return problems, notes


def check_server_layers(folders, layers, folder="server"):
    """Problems: a call from a file of one layer up into a higher layer's
    file, and a file of `folder` that no layer names."""
    rank = {}
    for i, (name, files) in enumerate(layers):
        for f in files:
            rank[f] = (i, name)
    problems = []
    files = folders.get(folder, {})
    for f in sorted(files):
        b = os.path.basename(f)
        if b not in rank:
            problems.append(f"{f}: in no layer of SERVER_LAYERS: place it "
                            "(docs/architecture.md, server/ in layers)")
            continue
        for g, syms in sorted(files[f].items()):
            gb = os.path.basename(g)
            if gb not in rank:
                continue
            (fi, fname), (gi, gname) = rank[b], rank[gb]
            if gi < fi:
                problems.append(f"{f} ({fname}) calls up into {g} ({gname}):"
                                f" {', '.join(syms[:4])}")
    return problems


def calls_self_test():
    """--calls must see a made-up circle, pass a known one, and fail a
    stale exception."""
    nm = {"x/a.c": "f T 0 1\ng U\nprintf U\n",
          "x/b.c": "g T 0 1\nh U\n",
          "x/c.c": "h T 0 1\nf U\n",
          "x/d.c": "k T 0 1\nf U\n",      # calls into the circle: fine
          "y/e.c": "m T 0 1\nf U\nn U\n",  # another folder's f: ignored
          "y/g.c": "n D 0 1\nm U\n",       # a circle through data
          "z/h.c": "p T 0 1\n"}
    symbols = {f: nm_parse(t) for f, t in nm.items()}
    problems, notes = check_calls(symbols, {"y": "made up", "z": "stale"})
    ok = (len(problems) == 2 and
          problems[0].startswith("x/: 3 files call each other in a "
                                 "circle: x/a.c, x/b.c, x/c.c") and
          "a.c -> b.c: g" in problems[0] and "d.c" not in problems[0] and
          "z/: no circle" in problems[1] and
          len(notes) == 1 and "e.c, g.c" in notes[0])
    layers = [("top", ["t.c"]), ("low", ["l.c"])]
    up = check_server_layers(
        call_graph({f: nm_parse(t) for f, t in {
            "s/t.c": "a T 0 1\nb U\n",   # down: fine
            "s/l.c": "b T 0 1\na U\n",   # up: a problem
            "s/new.c": "c T 0 1\n"}.items()}), layers, "s")
    ok = ok and len(up) == 2 and "s/l.c (low) calls up into s/t.c" in up[0] \
        and "s/new.c: in no layer" in up[1]
    if not ok:
        print("check_layout.py --calls self-test failed: got "
              f"{problems}, {notes} and {up}")
    return ok


def object_symbols(build, root):
    """{source file: (defined, undefined)} for every object the build
    compiled from a file of CALL_SCAN (the first, where a file is compiled
    into several targets)."""
    with open(os.path.join(build, "compile_commands.json")) as f:
        commands = json.load(f)
    objs = {}
    for e in commands:
        src = os.path.relpath(os.path.normpath(
            os.path.join(e["directory"], e["file"])), root)
        if src.split("/")[0] in CALL_SCAN and "output" in e:
            objs.setdefault(src, os.path.join(e["directory"], e["output"]))
    symbols, missing = {}, []
    for src, obj in sorted(objs.items()):
        r = subprocess.run(["nm", "-P", obj], capture_output=True, text=True)
        if r.returncode != 0:
            missing.append(f"{src}: its object {obj} could not be read "
                           f"(nm: {r.stderr.strip()}): build first")
            continue
        symbols[src] = nm_parse(r.stdout)
    return symbols, missing


def main_calls(build, root):
    if not calls_self_test():
        return 1
    symbols, missing = object_symbols(build, root)
    problems, notes = check_calls(symbols, CALL_CYCLE_EXCEPTIONS)
    problems = missing + problems
    read = {f.split("/")[0] for f in symbols}
    for top in CALL_SCAN:
        if top not in read:
            problems.append(f"{top}/: no object read: not checked")
    folders = call_graph(symbols)
    problems += check_server_layers(folders, SERVER_LAYERS)
    n = sum(len(g) for files in folders.values() for g in files.values())
    if n == 0:
        problems.append("no call between two files of a folder: nothing "
                        "checked")
    for p in problems:
        print(p)
    for p in notes:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s) of calls between files")
        return 1
    print(f"calls ok: {len(symbols)} files in {len(folders)} folders, {n} "
          "calls between files of a folder, no circle"
          + "".join(f" but {f}/" for f in sorted(CALL_CYCLE_EXCEPTIONS))
          + f"; server/ in {len(SERVER_LAYERS)} layers, no call up")
    return 0


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--calls":
        root = os.path.abspath(sys.argv[3] if len(sys.argv) > 3 else
                               os.path.join(os.path.dirname(__file__), ".."))
        return main_calls(os.path.abspath(sys.argv[2]), root)
    if len(sys.argv) > 1 and sys.argv[1] == "--archives":
        problems = check_archives(sys.argv[2:])
        for p in problems:
            print(p)
        if problems:
            print(f"{len(problems)} layering problem(s) in the objects")
            return 1
        print(f"objects ok: {len(sys.argv) - 2} archives, no reference "
              "upward but " + ", ".join(f"{p} -> {x}*"
                                        for p, x in sorted(LINK_EXCEPTIONS)))
        return 0
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    if not self_test():
        return 1
    problems, edges = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layering problem(s)")
        return 1
    n = sum(len(v) for v in edges.values())
    print(f"layering ok: {n} edges between {len(edges)} parts, no cycle")
    for src in sorted(edges):
        print(f"  {src} -> {', '.join(sorted(edges[src]))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
