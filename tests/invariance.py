#!/usr/bin/python3
"""An instance's answer never depends on what it was batched with.

For every family (and models described by cells), `canopy run` prints the
same bytes (logits, every node, hidden vectors, tags, CRF path scores,
decoded tokens) whatever the batching:

  --batch 1, 7, 64, and every instance in one run; --jobs 1 and 2;
  --policy none, depth, agenda (and the default, sufficient);
  --layout pq (the default) and naive;

then again under each OpenBLAS kernel this CPU can run (OPENBLAS_CORETYPE
Haswell, Zen, Sandybridge, and SkylakeX where AVX-512 exists), set for
the child processes of this test only: Canopy no longer links OpenBLAS
(its products are backends/cpu/gemm.c's), so every kernel must print the
same bytes as the machine's own setting; the sweep keeps it that way. Last, `canopy serve` under concurrent clients,
with requests of 1 to 8 instances sharing runs, answers each instance
exactly as `canopy run --batch 1` does.

Also runs the given test binaries (test_decode, test_serve_decode:
continuous decoding against decoding alone) once under each kernel.

usage: invariance.py CANOPY DATA_DIR WORK_DIR [CELLS_DIR [TEST_BIN ...]]
Prints the kernels it ran, one line per check, and "N passed, N failed".
"""
import hashlib, json, os, random, shutil, signal, subprocess, sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "python"))
from daemon_util import free_port, post_json, wait_ready  # noqa: E402

canopy, data, work = sys.argv[1], sys.argv[2], sys.argv[3]
cells = sys.argv[4] if len(sys.argv) > 4 else None
test_bins = sys.argv[5:]
work = os.path.join(work, "invariance")
LINES = 96  # instances per family: several runs at --batch 7 and 64

passed = failed = 0


def report(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
    print(("ok   " if ok else "FAIL ") + what, flush=True)


def kernels():
    """The machine's own setting (None) first, then every kernel the CPU
    can run."""
    flags = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = line
                break
    ks = [None]
    if " avx2" in flags:
        ks += ["Haswell", "Zen"]
    if " avx " in flags:
        ks += ["Sandybridge"]
    if " avx512f" in flags:
        ks += ["SkylakeX"]
    return ks


def head(src, dst, n):
    with open(src) as f, open(dst, "w") as o:
        for i, line in enumerate(f):
            if i >= n:
                break
            o.write(line)


# name: (family, data file, hidden, init args, run args)
FAMILIES = {
    "treelstm": ("treelstm", "trees-binary.jsonl", 24, [], ["--outputs", "all"]),
    "treelstm-2type": ("treelstm-2type", "trees-binary.jsonl", 16, [],
                       ["--outputs", "all"]),
    "treegru": ("treegru", "trees-binary.jsonl", 24, [], ["--outputs", "all"]),
    "childsum": ("childsum-treelstm", "trees-nary.jsonl", 24, [],
                 ["--outputs", "all"]),
    "mvrnn": ("mvrnn", "trees-binary.jsonl", 12, [], ["--outputs", "all"]),
    "bilstm": ("bilstm-tagger", "sequences.jsonl", 24, [], []),
    "bilstm-crf": ("bilstm-tagger", "sequences.jsonl", 24, ["--crf"], []),
    "latticelstm": ("latticelstm", "lattices.jsonl", 24, ["--lexicon"], []),
    "latticegru": ("latticegru", "dags.jsonl", 24, [], []),
    "nmt": ("lstm-nmt", "sequences.jsonl", 24, [], ["--max-decode-len", "12"]),
}
# models described by cells (tests/cells), on the weights of a built-in
# with H = 16, D = 12 (the sizes those descriptions are written for; a
# third field: another D)
CELLS = {"cells-treelstm": ("treelstm", "treelstm.json"),
         "cells-treegru": ("treegru", "treegru.json"),
         "cells-childsum": ("childsum", "childsum-treelstm.json"),
         "cells-mvrnn": ("mvrnn", "mvrnn.json", 16),
         "cells-latticegru": ("latticegru", "latticegru.json"),
         "cells-bilstm": ("bilstm", "bilstm-tagger.json")}


def make_models():
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    lex = os.path.join(work, "lexicon.txt")
    head(os.path.join(data, "lexicon.txt"), lex, 3000)
    specs = {}
    for name, (fam, fname, H, extra, run_args) in FAMILIES.items():
        inp = os.path.join(work, name + ".jsonl")
        head(os.path.join(data, fname), inp, LINES)
        if "--lexicon" in extra:
            extra = ["--lexicon", lex]
        d = os.path.join(work, "models", name)
        subprocess.run([canopy, "model", "init", fam, d, "--hidden", str(H),
                        "--embed", str(H), "--vocab-from",
                        os.path.join(data, fname), "--seed", "3"] + extra,
                       check=True, stderr=subprocess.DEVNULL)
        specs[name] = (d, inp, run_args)
    if cells:
        for name, (base, desc, *emb) in CELLS.items():
            fam, fname, _, extra, run_args = FAMILIES[base]
            d = os.path.join(work, "models", name)
            subprocess.run([canopy, "model", "init", fam, d, "--hidden",
                            "16", "--embed", str(emb[0] if emb else 12),
                            "--vocab-from",
                            os.path.join(data, fname), "--seed", "4"],
                           check=True, stderr=subprocess.DEVNULL)
            with open(os.path.join(d, "model.json")) as f:
                builtin = json.load(f)
            with open(os.path.join(cells, desc)) as f:
                j = json.load(f)
            if "labels" in builtin and "labels" not in j:
                j["labels"] = builtin["labels"]
            with open(os.path.join(d, "model.json"), "w") as f:
                json.dump(j, f)
            specs[name] = (d, specs[base][1], run_args)
    return specs


def run(model, inp, run_args, flags, kernel=None):
    env = dict(os.environ)
    if kernel is not None:
        env["OPENBLAS_CORETYPE"] = kernel
    p = subprocess.run([canopy, "run", "--model", model, "--input", inp,
                        "--return-hidden"] + run_args + flags,
                       capture_output=True, env=env, timeout=600)
    if p.returncode != 0:
        return None, p.stderr.decode(errors="replace")[-400:]
    return p.stdout, None


# Each against --batch 1 of its layout. The layout is a setting of the
# whole process (the daemon's `layout` key), not of the traffic; the
# default (pq) runs in CONFIGS, naive below.
CONFIGS = [["--batch", "7", "--jobs", "1"], ["--batch", "64", "--jobs", "1"],
           ["--batch", "100000", "--jobs", "1"], ["--batch", "16", "--jobs", "2"],
           ["--policy", "none"], ["--policy", "depth"], ["--policy", "agenda"]]
LAYOUT_CONFIGS = [["--batch", "64"], ["--batch", "5", "--policy", "agenda"],
                  ["--batch", "100000", "--jobs", "2", "--policy", "depth"]]


def digest(b):
    return hashlib.sha256(b).hexdigest()[:12]


def check_cli(specs, ks):
    base = {}
    for name, (d, inp, run_args) in specs.items():
        ref, err = run(d, inp, run_args, ["--batch", "1", "--jobs", "1"])
        report(ref is not None and ref.count(b"\n") == LINES,
               f"{name}: --batch 1 runs ({err or digest(ref or b'')})")
        if ref is None:
            continue
        base[name] = ref
        for flags in CONFIGS:
            got, err = run(d, inp, run_args, flags)
            report(got == ref, f"{name}: {' '.join(flags)} equals --batch 1"
                   + (f" ({err})" if err else ""))
        for layout in ("naive",):
            lflags = ["--layout", layout]
            lref, err = run(d, inp, run_args, lflags + ["--batch", "1"])
            for flags in LAYOUT_CONFIGS:
                got, err = run(d, inp, run_args, lflags + flags)
                report(lref is not None and got == lref,
                       f"{name}: {' '.join(lflags + flags)} equals "
                       f"--layout {layout} --batch 1"
                       + (f" ({err})" if err else ""))
        for k in ks[1:]:
            for flags in (["--batch", "1", "--jobs", "1"],
                          ["--batch", "100000", "--jobs", "2"]):
                got, err = run(d, inp, run_args, flags, kernel=k)
                report(got == ref, f"{name}: OPENBLAS_CORETYPE={k} "
                       f"{' '.join(flags)} equals the machine's --batch 1"
                       + (f" ({err})" if err else ""))
    return base


def check_daemon(specs, base):
    """Concurrent clients, requests of 1-8 instances, against --batch 1."""
    port = free_port()
    log = open(os.path.join(work, "serve.log"), "w")
    srv = subprocess.Popen([canopy, "serve", "--models-dir",
                            os.path.join(work, "models"), "--port", str(port),
                            "--workers", "2", "--max-delay-us", "3000"],
                           stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_ready(url, srv, 120):
            report(False, "canopy serve became ready (serve.log: %s)" %
                   open(os.path.join(work, "serve.log")).read()[-600:])
            return
        for name, (d, inp, run_args) in specs.items():
            if name not in base:
                continue
            want = [json.loads(l) for l in base[name].splitlines()]
            with open(inp) as f:
                lines = [json.loads(l) for l in f]
            opts = {"return_hidden": True}
            if "--outputs" in run_args:
                opts["outputs"] = "all"
            if "--max-decode-len" in run_args:
                opts["max_decode_len"] = int(run_args[-1])
            rnd = random.Random(7)
            chunks, i = [], 0
            while i < len(lines):
                n = rnd.randint(1, 8)
                chunks.append(list(range(i, min(i + n, len(lines)))))
                i += n
            got, errors = [None] * len(lines), []

            def client(k):
                for c in chunks[k::6]:
                    body = dict(opts, instances=[lines[i] for i in c])
                    try:
                        st, ans = post_json(f"{url}/v1/models/{name}/infer", body)
                    except OSError as e:
                        errors.append(str(e))
                        return
                    if st != 200:
                        errors.append(f"HTTP {st}: {ans}")
                        continue
                    for i, o in zip(c, ans["outputs"]):
                        got[i] = o

            ts = [threading.Thread(target=client, args=(k,)) for k in range(6)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            bad = [i for i in range(len(lines)) if got[i] != want[i]]
            report(not errors and not bad,
                   f"{name}: the daemon under 6 concurrent clients equals "
                   f"--batch 1" + (f" ({errors[:1]}, instances {bad[:5]})"
                                   if errors or bad else ""))
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
        log.close()


def check_test_bins(ks):
    for k in ks[1:]:
        env = dict(os.environ, OPENBLAS_CORETYPE=k)
        for t in test_bins:
            p = subprocess.run([t], capture_output=True, env=env, timeout=600)
            tail = (p.stdout + p.stderr).decode(errors="replace")[-600:]
            report(p.returncode == 0, f"{os.path.basename(t)} under "
                   f"OPENBLAS_CORETYPE={k}" + ("" if p.returncode == 0
                                               else f":\n{tail}"))


def main():
    ks = kernels()
    print("kernels: the machine's own (OPENBLAS_CORETYPE=%s), then %s"
          % (os.environ.get("OPENBLAS_CORETYPE", "unset"),
             ", ".join(ks[1:]) or "none"), flush=True)
    specs = make_models()
    base = check_cli(specs, ks)
    check_daemon(specs, base)
    check_test_bins(ks)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


sys.exit(main())
