#!/usr/bin/python3
"""Every family over real HTTP against the independent reference.

Starts `canopy serve` on a free loopback port over a directory of models,
sends each data file's instances from several concurrent clients (so
instances of different requests share runs), and compares every answer
with tests/reference/canopy_ref.py to 1e-4 (compare.py's rules). Then
sends SIGTERM and checks the daemon drains and exits 0.

usage: compare_http.py --canopy BIN --models-dir DIR
         MODEL=INPUT[:all][:hidden][:decode=N] ...
"""
import argparse, json, os, signal, subprocess, sys, threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import canopy_ref  # noqa: E402
import compare  # noqa: E402
from daemon_util import free_port, post_json, wait_ready  # noqa: E402


def check(base, models_dir, spec, clients=4, per_request=8):
    name, rest = spec.split("=", 1)
    parts = rest.split(":")
    path, opts = parts[0], parts[1:]
    outputs = "all" if "all" in opts else "root"
    hidden = "hidden" in opts
    decode = next((int(o[7:]) for o in opts if o.startswith("decode=")), None)
    model = canopy_ref.Model(os.path.join(models_dir, name))
    lines = canopy_ref.read_lines(path)
    refs = [canopy_ref.to_plain(canopy_ref.run_line(model, l, i, outputs,
                                                    hidden, decode))
            for i, l in enumerate(lines)]
    cap = model.decode_cap(decode) if model.family == "lstm-nmt" else None
    got = [None] * len(lines)
    chunks = [list(range(i, min(i + per_request, len(lines))))
              for i in range(0, len(lines), per_request)]
    errors = []

    def worker(k):
        for c in chunks[k::clients]:
            body = {"instances": [json.loads(lines[i]) for i in c],
                    "outputs": outputs, "return_hidden": hidden}
            if decode is not None:
                body["max_decode_len"] = decode
            status, ans = post_json(f"{base}/v1/models/{name}/infer", body)
            if status != 200:
                errors.append(f"{name}: HTTP {status}: {ans}")
                continue
            for i, o in zip(c, ans["outputs"]):
                got[i] = o

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    bad, maxdiff = 0, 0.0
    for i, ref in enumerate(refs):
        if got[i] is None:
            bad += 1
            continue
        c = compare.compare_instance(model, ref, got[i], 1e-4, 1e-5, cap)
        maxdiff = max(maxdiff, c.maxdiff)
        if c.problems:
            bad += 1
            if bad <= 3:
                errors.append(f"{name} instance {i}: {c.problems[:2]}")
    print(f"{name:<22} {os.path.basename(path):<22} {outputs:<4} "
          f"{len(lines):>5} instances  max diff {maxdiff:.3e}  "
          f"mismatches {bad}")
    for e in errors[:5]:
        print("  " + e, file=sys.stderr)
    return bad == 0 and not errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--canopy", required=True)
    ap.add_argument("--models-dir", required=True)
    ap.add_argument("specs", nargs="+")
    a = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    d = subprocess.Popen([a.canopy, "serve", "--models-dir", a.models_dir,
                          "--host", "127.0.0.1", "--port", str(port),
                          "--policy", "agenda", "--log-level", "warn"])
    ok = False
    try:
        if not wait_ready(base, d, 60):
            print("the daemon did not become ready", file=sys.stderr)
            return 1
        ok = all([check(base, a.models_dir, s) for s in a.specs])
    finally:
        d.send_signal(signal.SIGTERM)
        try:
            rc = d.wait(timeout=30)
        except subprocess.TimeoutExpired:
            d.kill()
            rc = -9
    if rc != 0:
        print(f"the daemon exited {rc} after SIGTERM", file=sys.stderr)
        ok = False
    print("over HTTP: " + ("all equal to the reference" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
