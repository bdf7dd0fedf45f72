"""test_systemd.py - deploy/canopy.service and the notify protocol.

1. The unit: `systemd-analyze verify` on a temp copy whose ExecStart names
   the build's binary (verify insists the binary exists; the committed
   unit names /usr/local/bin/canopy, where the install steps put it) must
   print nothing (it exits 0 even on unknown keys and bad values, so any
   output fails), `systemd-analyze security --offline` must rate it 2.0
   or less, and the keys the deployment relies on must be there
   (Type=notify, TimeoutStopSec above drain-grace-ms + 1 s, a dedicated
   user, state and cache directories with CANOPY_POLICY_CACHE in the
   cache one, the hardening).
2. The protocol against the real daemon: the test binds a unix datagram
   socket, starts `canopy serve` with NOTIFY_SOCKET naming it, and expects
   READY=1 from the daemon's own pid (SCM_CREDENTIALS, what systemd's
   NotifyAccess=main checks) with /readyz already 200, then STOPPING=1
   after SIGTERM, then exit 0. Again with an abstract socket ("@name"),
   and with a NOTIFY_SOCKET that cannot be used (a warning, still serving).

usage: test_systemd.py UNIT CANOPY_CONF   (CANOPY_BIN, CANOPY_DATA)
"""
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploylib import (Skip, canopy_bin, check, free_port,  # noqa
                       init_model, main, request)


def unit_keys(path):
    """{(section, key): [values]} of a unit file (keys may repeat)."""
    keys, section = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line.strip("[]")
                continue
            k, _, v = line.partition("=")
            keys.setdefault((section, k.strip()), []).append(v.strip())
    return keys


def seconds(v):
    m = re.fullmatch(r"(\d+)\s*(ms|s|min)?", v)
    check(m, f"cannot read the time {v!r}")
    return int(m.group(1)) * {"ms": 1e-3, "s": 1, None: 1, "min": 60}[m.group(2)]


def check_unit(procs, unit, conf):
    if shutil.which("systemd-analyze") is None:
        raise Skip("systemd-analyze not installed (Debian systemd)")
    with open(unit) as f:
        text = f.read()
    check("ExecStart=/usr/local/bin/canopy serve" in text,
          "ExecStart should start /usr/local/bin/canopy serve")
    copy = os.path.join(procs.dir, "canopy.service")
    with open(copy, "w") as f:
        f.write(text.replace("ExecStart=/usr/local/bin/canopy",
                             "ExecStart=" + os.path.abspath(canopy_bin())))
    r = subprocess.run(["systemd-analyze", "verify", copy],
                       capture_output=True, text=True, cwd=procs.dir)
    out = (r.stdout + r.stderr).strip()
    check(r.returncode == 0 and not out,
          f"systemd-analyze verify (exit {r.returncode}):\n{out}")
    r = subprocess.run(["systemd-analyze", "security", "--offline=true",
                        "--threshold=20", copy],
                       capture_output=True, text=True, cwd=procs.dir)
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)",
                      r.stdout)
    check(level and r.returncode == 0, f"systemd-analyze security: exposure "
          f"above 2.0 (exit {r.returncode}):\n{r.stdout[-3000:]}{r.stderr}")

    k = unit_keys(unit)

    def one(key, section="Service"):
        v = k.get((section, key))
        check(v, f"[{section}] {key}= missing")
        return v[-1]

    check(one("Type") == "notify", "Type=notify")
    check(one("ExecReload").endswith("kill -HUP $MAINPID"), "ExecReload")
    with open(conf) as f:
        grace = re.search(r"^drain-grace-ms (\d+)", f.read(), re.M)
    check(grace, f"{conf}: no drain-grace-ms line")
    stop = seconds(one("TimeoutStopSec"))
    check(stop > int(grace.group(1)) / 1e3 + 1, f"TimeoutStopSec {stop} s "
          f"is not above drain-grace-ms {grace.group(1)} + 1 s")
    check(one("DynamicUser") == "yes" or k.get(("Service", "User")),
          "a dedicated user (DynamicUser=yes or User=)")
    cache = one("CacheDirectory")
    one("StateDirectory")
    env = " ".join(k.get(("Service", "Environment"), []))
    check(re.search(rf"CANOPY_POLICY_CACHE=/var/cache/{cache}(/|\s|$)", env),
          f"CANOPY_POLICY_CACHE should be under /var/cache/{cache}: {env}")
    for key, want in [("ProtectSystem", "strict"), ("NoNewPrivileges", "yes"),
                      ("PrivateTmp", "yes"), ("ProtectHome", "yes")]:
        check(one(key) == want, f"{key}={want}")
    fam = one("RestrictAddressFamilies").split()
    check("AF_UNIX" in fam and "AF_INET" in fam,
          f"RestrictAddressFamilies needs AF_INET and AF_UNIX (notify): {fam}")
    print(f"unit: verify clean, exposure {level.group(1)} {level.group(2)}, "
          f"TimeoutStopSec {stop:g} s > drain grace "
          f"{int(grace.group(1)) / 1e3:g} s + 1 s")


def listen_notify(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + path[1:] if path.startswith("@") else path)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    return s


def recv_notify(s, timeout):
    """(message, sender pid), or (None, None) after timeout seconds."""
    s.settimeout(timeout)
    try:
        msg, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(12))
    except socket.timeout:
        return None, None
    pid = None
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = struct.unpack("iii", data[:12])[0]
    return msg.decode(), pid


def notify_run(procs, sock_path, tag):
    s = listen_notify(sock_path)
    port = free_port()
    t0 = time.monotonic()
    p = procs.start([canopy_bin(), "serve", "--port", str(port),
                     "--models-dir", os.path.join(procs.dir, "models"),
                     "--model-control", "explicit"],
                    f"serve-{tag}.log", env={
                        "NOTIFY_SOCKET": sock_path,
                        "CANOPY_POLICY_CACHE": os.path.join(procs.dir, "pc")})
    try:
        msg, pid = recv_notify(s, 20)
        t_ready = time.monotonic() - t0
        check(msg is not None, f"{tag}: no READY=1 in 20 s:\n{procs.log(p)}")
        lines = msg.split("\n")
        check("READY=1" in lines, f"{tag}: first message {msg!r}")
        check(pid == p.pid, f"{tag}: sender pid {pid}, daemon {p.pid}")
        # Ready means ready: the port answers and readiness is 200 now.
        st = request(port, "GET", "/readyz", timeout=5)[0]
        check(st == 200, f"{tag}: /readyz {st} right after READY=1")
        extra, _ = recv_notify(s, 0.3)
        check(extra is None, f"{tag}: unexpected message {extra!r}")
        # systemctl reload: SIGHUP rescans models-dir (model-control
        # explicit): RELOADING=1, then READY=1 when the rescan is done
        p.send_signal(signal.SIGHUP)
        msg, _ = recv_notify(s, 10)
        check(msg is not None and "RELOADING=1" in msg.split("\n"),
              f"{tag}: after SIGHUP: {msg!r}\n{procs.log(p)}")
        msg, _ = recv_notify(s, 10)
        check(msg is not None and "READY=1" in msg.split("\n"),
              f"{tag}: after the rescan: {msg!r}\n{procs.log(p)}")
        p.send_signal(signal.SIGTERM)
        msg, pid = recv_notify(s, 10)
        check(msg is not None and "STOPPING=1" in msg.split("\n"),
              f"{tag}: after SIGTERM: {msg!r}\n{procs.log(p)}")
        check(pid == p.pid, f"{tag}: STOPPING=1 from pid {pid}")
        check(p.wait(20) == 0, f"{tag}: exit {p.returncode}")
        print(f"notify ({tag}): READY=1 {t_ready * 1e3:.0f} ms after exec "
              f"with /readyz 200, STOPPING=1 at SIGTERM, exit 0")
    finally:
        s.close()


def body(procs):
    unit, conf = sys.argv[1], sys.argv[2]
    check_unit(procs, unit, conf)
    init_model(procs)
    notify_run(procs, os.path.join(procs.dir, "notify.sock"), "path")
    notify_run(procs, f"@canopy-test-notify-{os.getpid()}", "abstract")

    # A NOTIFY_SOCKET nobody listens on: a warning, and the daemon serves.
    port = free_port()
    p = procs.start([canopy_bin(), "serve", "--port", str(port),
                     "--models-dir", os.path.join(procs.dir, "models")],
                    "serve-nobody.log", env={
                        "NOTIFY_SOCKET": os.path.join(procs.dir, "none.sock"),
                        "CANOPY_POLICY_CACHE": os.path.join(procs.dir, "pc")})
    t_end = time.monotonic() + 60
    st = None
    while time.monotonic() < t_end and p.poll() is None:
        try:
            st = request(port, "GET", "/readyz", timeout=1)[0]
            break
        except OSError:
            time.sleep(0.02)
    check(st == 200, f"no listener on NOTIFY_SOCKET: /readyz {st}:\n"
          f"{procs.log(p)}")
    p.send_signal(signal.SIGTERM)
    check(p.wait(20) == 0, "exit status")
    check("msg=notify-failed" in procs.log(p),
          f"no notify-failed warning:\n{procs.log(p)}")


if __name__ == "__main__":
    sys.exit(main(body, "deploy_systemd"))
