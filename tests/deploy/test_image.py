"""test_image.py - the container image without Docker (no Docker daemon
runs on the test machines).

1. The entrypoint (deploy/image/entrypoint.sh) with the build's
   `canopy` on PATH: nothing mounted, an empty mount and a missing one
   serve the demo models; a non-empty mount serves what is mounted, only
   that; CANOPY_REQUIRE_MODELS=1 with nothing mounted exits 1; the
   daemon is exec'd (it is the process that got SIGTERM, and exits 0).
   The HEALTHCHECK script answers 0 while ready, 1 with nothing listening
   and 1 once SIGTERM began the drain.
2. The Dockerfile's build stage, release build only (it compiles the
   tree again: ~30 s on 2 cores): the tree is copied as `docker build`
   would send it (.dockerignore applied), and the stage's RUN line with
   meson, ninja, the install and the demo models runs there with /build
   and /opt/canopy moved under a temp dir. The installed tree must hold
   bin/canopy (which loads every demo model), the entrypoint and the
   health check the runtime stage names, and the demo models; then the
   entrypoint serves them from the installed tree.

usage: test_image.py SOURCE_ROOT   (CANOPY_BIN, CANOPY_DATA from meson)
       test_image.py --context SOURCE_ROOT   (only the context's size)
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploylib import (Fail, Skip, canopy_bin, check, free_port,  # noqa
                       init_model, main, request)

import json


def models_listed(port):
    st, _, body = request(port, "GET", "/v1/models")
    check(st == 200, f"/v1/models: {st}")
    return sorted(m["name"] for m in json.loads(body)["models"])


def healthcheck(script, port=None, pid=None, env=None):
    """The HEALTHCHECK script's exit status. port: as $CANOPY_PORT; pid:
    the daemon it reads flags from (default none: "0" names no process,
    so no daemon of this machine's PID 1 is read by mistake)."""
    e = {k: v for k, v in os.environ.items()
         if k not in ("CANOPY_PORT", "CANOPY_CONFIG")}
    e["CANOPY_HEALTHCHECK_PID"] = str(pid or 0)
    if port is not None:
        e["CANOPY_PORT"] = str(port)
    e.update(env or {})
    r = subprocess.run(["bash", script], env=e, capture_output=True,
                       timeout=10)
    return r.returncode


def dockerfile_port(src):
    """The runtime stage listens where its health check probes: the port
    and address are ENV daemon keys, CMD passes neither (arguments given
    to `docker run` replace CMD), EXPOSE is that port (and the gRPC one)."""
    with open(os.path.join(src, "Dockerfile")) as f:
        runtime = re.split(r"^FROM ", f.read().replace("\\\n", " "),
                           flags=re.M)[-1]
    env = dict(re.findall(r"\b(CANOPY_[A-Z_]+)=(\S+)", " ".join(
        l for l in runtime.splitlines() if l.startswith("ENV "))))
    check(env.get("CANOPY_PORT") and env.get("CANOPY_HOST") == "0.0.0.0",
          f"runtime ENV: CANOPY_PORT and CANOPY_HOST=0.0.0.0: {env}")
    cmd = re.search(r"^CMD (.*)$", runtime, re.M)
    check(cmd is None or not re.search(r"--(port|host)\b", cmd.group(1)),
          f"CMD sets the port or host, which ENV sets: {cmd.group(1)}")
    # EXPOSE: CANOPY_PORT first, then the gRPC port the manifests set
    check(re.search(rf"^EXPOSE {env['CANOPY_PORT']}( \d+)*$", runtime,
                    re.M), f"EXPOSE is not CANOPY_PORT {env['CANOPY_PORT']}")
    check('CMD ["canopy-healthcheck"]' in runtime, "HEALTHCHECK script")
    return int(env["CANOPY_PORT"])


def run_entrypoint(procs, src, path_dir, mount, demo, tag, env=None,
                   port_by_env=False):
    """Starts the entrypoint; returns (process, port) once it serves, or
    (process, None) if it exited. port_by_env: the port as CANOPY_PORT,
    no --port argument."""
    port = free_port()
    e = {"PATH": f"{path_dir}:{os.environ['PATH']}",
         "CANOPY_MODELS_MOUNT": mount, "CANOPY_DEMO_MODELS": demo,
         "CANOPY_POLICY_CACHE": os.path.join(procs.dir, "pc")}
    argv = ["--host", "127.0.0.1"]
    if port_by_env:
        e["CANOPY_PORT"] = str(port)
    else:
        argv += ["--port", str(port)]
    e.update(env or {})
    p = procs.start([os.path.join(src, "deploy/image/entrypoint.sh"),
                     *argv], f"entrypoint-{tag}.log", env=e)
    t_end = time.monotonic() + 60
    while time.monotonic() < t_end:
        if p.poll() is not None:
            return p, None
        try:
            if request(port, "GET", "/v2/health/ready", timeout=1)[0] == 200:
                return p, port
        except OSError:
            pass
        time.sleep(0.02)
    raise Fail(f"entrypoint ({tag}) did not serve in 60 s:\n{procs.log(p)}")


def stop(procs, p, tag):
    with open(f"/proc/{p.pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    check(os.path.basename(argv[0].decode()) == "canopy" and argv[1] == b"serve",
          f"{tag}: the entrypoint did not exec the daemon: {argv}")
    p.send_signal(signal.SIGTERM)
    check(p.wait(20) == 0, f"{tag}: exit {p.returncode}:\n{procs.log(p)}")


def entrypoint_checks(procs, src, path_dir, demo, want_demo):
    hc = os.path.join(src, "deploy/image/healthcheck.sh")
    mnt = os.path.join(procs.dir, "mnt")
    # Nothing mounted (no directory): the demo models.
    p, port = run_entrypoint(procs, src, path_dir, mnt, demo, "missing")
    check(port, f"missing mount: exited {p.returncode}:\n{procs.log(p)}")
    check(models_listed(port) == want_demo, "missing mount: demo models")
    check("serving the demo models" in procs.log(p), "no demo-models line")
    check(healthcheck(hc, port) == 0, "healthcheck while ready")
    # The port the daemon was given is the one probed: its --port flag
    # wins over a CANOPY_PORT naming nothing, as in the daemon.
    other = free_port()
    check(healthcheck(hc, pid=p.pid) == 0, "healthcheck: the daemon's --port")
    check(healthcheck(hc, other, pid=p.pid) == 0,
          "healthcheck: --port wins over CANOPY_PORT")
    check(healthcheck(hc, other) == 1, "healthcheck on a closed port")
    cfg = os.path.join(procs.dir, "hc.conf")
    with open(cfg, "w") as f:
        f.write(f"# a config file\nport {port}\n")
    check(healthcheck(hc, env={"CANOPY_CONFIG": cfg}) == 0,
          "healthcheck: the config file's port")
    # Draining: the health check fails at once (the port is closed).
    p.send_signal(signal.SIGTERM)
    t_end, h = time.monotonic() + 5, 0
    while time.monotonic() < t_end and h == 0:
        h = healthcheck(hc, port)
    check(h == 1, "healthcheck 0 after SIGTERM")
    check(p.wait(20) == 0, f"exit after SIGTERM {p.returncode}")
    check(healthcheck(hc, port) == 1, "healthcheck with nothing listening")
    # An empty mount: the demo models; the port from the environment
    # only (the image's way: ENV CANOPY_PORT, no --port).
    os.makedirs(mnt)
    p, port = run_entrypoint(procs, src, path_dir, mnt, demo, "empty",
                             port_by_env=True)
    check(port and models_listed(port) == want_demo, "empty mount")
    check(healthcheck(hc, port, pid=p.pid) == 0,
          "healthcheck: CANOPY_PORT alone")
    stop(procs, p, "empty")
    # CANOPY_REQUIRE_MODELS=1 and nothing mounted: refuse.
    p, port = run_entrypoint(procs, src, path_dir, mnt, demo, "require",
                             env={"CANOPY_REQUIRE_MODELS": "1"})
    check(port is None and p.returncode == 1,
          f"CANOPY_REQUIRE_MODELS=1 with an empty mount: {p.returncode}")
    # Something mounted: that, only that.
    shutil.copytree(os.path.join(procs.dir, "models", "treelstm"),
                    os.path.join(mnt, "mine"))
    p, port = run_entrypoint(procs, src, path_dir, mnt, demo, "mounted",
                             env={"CANOPY_REQUIRE_MODELS": "1"})
    check(port and models_listed(port) == ["mine"],
          f"mounted: {models_listed(port) if port else procs.log(p)}")
    stop(procs, p, "mounted")
    shutil.rmtree(mnt)


def dockerignore_regex(pattern):
    """Docker's pattern syntax (filepath.Match plus **) as a regex."""
    p = pattern.strip().strip("/")
    out, i = "", 0
    while i < len(p):
        if p.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif p.startswith("**", i):
            out, i = out + ".*", i + 2
        elif p[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif p[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(p[i]), i + 1
    return re.compile(out + r"\Z")


def docker_context(src, dst=None):
    """Copies src to dst as `docker build` would send it (dst None: only
    counts); returns (files, bytes, excluded names)."""
    with open(os.path.join(src, ".dockerignore")) as f:
        pats = [dockerignore_regex(x) for x in f
                if x.strip() and not x.startswith("#")]
    check(not any(x.startswith("!") for x in open(
        os.path.join(src, ".dockerignore"))), "no ! exceptions supported")
    n = size = 0
    excluded = set()
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        rel = "" if rel == "." else rel + "/"
        keep = []
        for d in sorted(dirs):
            if any(p.match(rel + d) for p in pats):
                excluded.add(rel + d)
            else:
                keep.append(d)
        dirs[:] = keep
        if dst is not None:
            os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for f in files:
            if any(p.match(rel + f) for p in pats):
                excluded.add(rel + f)
                continue
            s = os.path.join(root, f)
            if os.path.islink(s):
                if dst is not None:
                    os.symlink(os.readlink(s), os.path.join(dst, rel, f))
                continue
            if dst is not None:
                shutil.copy2(s, os.path.join(dst, rel, f))
            n += 1
            size += os.path.getsize(s)
    return n, size, excluded


def build_stage(procs, src):
    with open(os.path.join(src, "Dockerfile")) as f:
        text = f.read().replace("\\\n", " ")
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    build = [s for s in stages if re.match(r"\S+ AS build", s)]
    check(len(build) == 1, "no `FROM ... AS build` stage")
    runs = [x[4:] for x in build[0].splitlines() if x.startswith("RUN ")
            and "meson setup" in x]
    check(len(runs) == 1, f"build stage: {len(runs)} RUN lines with meson")
    runtime = stages[-1]

    ctx = os.path.join(procs.dir, "src")
    t0 = time.monotonic()
    n, size, excluded = docker_context(src, ctx)
    for must in ("build", ".git"):
        if os.path.exists(os.path.join(src, must)):
            check(must in excluded, f".dockerignore lets {must} through")
    check(not os.path.exists(os.path.join(ctx, "models")),
          "models/ in the build context")
    print(f"image: context {n} files, {size / 1e6:.1f} MB; left out: "
          f"{', '.join(sorted(x for x in excluded if '/' not in x))}")

    b, prefix = os.path.join(procs.dir, "build"), os.path.join(procs.dir,
                                                              "opt-canopy")
    cmd = re.sub(r"(?<![\w.])/build\b", b, runs[0])
    cmd = cmd.replace("/opt/canopy", prefix).replace("ninja -C", "ninja -j2 -C")
    check(b in cmd and prefix in cmd, f"substitution failed: {cmd}")
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=ctx,
                       capture_output=True, text=True, timeout=600)
    check(r.returncode == 0, f"build stage RUN failed ({r.returncode}):\n"
          f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    t_build = time.monotonic() - t0

    # What the runtime stage copies and names must be there.
    check("COPY --from=build /opt/canopy /opt/canopy" in runtime,
          "runtime stage copies /opt/canopy")
    names = re.findall(r'"(canopy-[a-z]+)"', runtime)
    check("canopy-entrypoint" in names and "canopy-healthcheck" in names,
          f"runtime ENTRYPOINT / HEALTHCHECK: {names}")
    for x in ["canopy"] + names:
        check(os.access(os.path.join(prefix, "bin", x), os.X_OK),
              f"installed tree: bin/{x} missing")
    # the context has no .git (nor the build stage git), and
    # the build still says which version it is, and that it has no commit
    with open(os.path.join(src, "meson.build")) as f:
        pv = re.search(r"version\s*:\s*'([^']+)'", f.read()).group(1)
    for argv in (["--version"], ["serve", "--version"]):
        r = subprocess.run([os.path.join(prefix, "bin", "canopy")] + argv,
                           capture_output=True, text=True)
        check(r.returncode == 0 and r.stdout == f"canopy {pv} (not built "
              "from a git checkout)\n", f"installed canopy {argv}: "
              f"{r.returncode} {r.stdout!r} {r.stderr!r}")
    check(re.search(r"^USER \d+", runtime, re.M), "USER should be numeric")
    cache = re.search(r"CANOPY_POLICY_CACHE=(\S+)", runtime)
    check(cache and re.search(rf"chown -R \S+ {os.path.dirname(cache.group(1))}",
                              runtime),
          "the policy cache directory is created and owned by the user")
    demo = os.path.join(prefix, "models")
    found = sorted(d for d in os.listdir(demo)
                   if os.path.exists(os.path.join(demo, d, "model.json")))
    check(len(found) >= 5, f"demo models installed: {found}")
    for m in found:
        r = subprocess.run([os.path.join(prefix, "bin", "canopy"), "model",
                            "info", os.path.join(demo, m)],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"installed canopy cannot load {m}:\n"
              f"{r.stderr}")
    print(f"image: build stage ran in {t_build:.0f} s; installed bin/canopy, "
          f"canopy-entrypoint, canopy-healthcheck, {len(found)} demo models "
          f"({', '.join(found)})")
    return prefix, found


def body(procs):
    src = os.path.abspath(sys.argv[1])
    init_model(procs)  # a tiny demo set for the entrypoint checks
    demo = os.path.join(procs.dir, "demo")
    shutil.copytree(os.path.join(procs.dir, "models"), demo)
    bindir = os.path.join(procs.dir, "bin")
    os.makedirs(bindir)
    os.symlink(os.path.abspath(canopy_bin()), os.path.join(bindir, "canopy"))
    img_port = dockerfile_port(src)
    entrypoint_checks(procs, src, bindir, demo, ["treelstm"])
    print("entrypoint: demo models when /models is missing or empty, the "
          "mount when not, exit 1 under CANOPY_REQUIRE_MODELS; healthcheck "
          "0 ready, 1 draining / closed; it probes the daemon's --port, "
          f"else CANOPY_PORT, else the config file's (image: ENV "
          f"CANOPY_PORT={img_port}, no --port in CMD)")

    if os.environ.get("CANOPY_SANITIZE", "none") not in ("", "none"):
        print("sanitizer build: the Dockerfile build stage (its own release "
              "build) is left to the release build")
        return
    if shutil.which("meson") is None or shutil.which("ninja") is None:
        raise Skip("meson / ninja not installed")
    prefix, found = build_stage(procs, src)
    # The entrypoint on the installed tree: the image's demo models.
    p, port = run_entrypoint(procs, src, os.path.join(prefix, "bin"),
                             os.path.join(procs.dir, "none"),
                             os.path.join(prefix, "models"), "installed")
    check(port, f"installed tree: {procs.log(p)}")
    check(models_listed(port) == found, "installed tree: demo models")
    stop(procs, p, "installed")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--context"]:
        # docs/deploy.md's figures: what `docker build` sends from the tree
        # given (a fresh clone: `git clone . /tmp/c && test_image.py
        # --context /tmp/c`), .dockerignore applied, symlinks not counted
        n, size, excluded = docker_context(os.path.abspath(sys.argv[2]))
        print(f"{n} files, {size} bytes ({size / 1e6:.1f} MB); left out: "
              f"{', '.join(sorted(x for x in excluded if '/' not in x))}")
        sys.exit(0)
    sys.exit(main(body, "deploy_image"))
