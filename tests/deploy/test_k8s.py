"""test_k8s.py - deploy/k8s/: every manifest parses and has what the
deployment relies on. No cluster ran these manifests (none here): the
checks are on their content, plus one run of the pod's process outside a
cluster - the image's entrypoint with the Deployment's arguments and
environment and the ConfigMap's file - probed at the probes' paths and
stopped with SIGTERM within the grace period.

usage: test_k8s.py K8S_DIR REPO_ROOT   (CANOPY_BIN, CANOPY_DATA from meson)
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploylib import (Fail, Skip, canopy_bin, check, free_port,  # noqa
                       grpc_built, init_model, main, start_pod)

try:
    import yaml
except ImportError:
    yaml = None

ENTRYPOINT_VARS = {"CANOPY_REQUIRE_MODELS", "CANOPY_MODELS_MOUNT",
                   "CANOPY_DEMO_MODELS"}


def load_all(k8s):
    docs = {}
    for f in sorted(os.listdir(k8s)):
        if not f.endswith(".yaml"):
            continue
        with open(os.path.join(k8s, f)) as fh:
            try:
                for d in yaml.safe_load_all(fh):
                    if d is None:
                        continue
                    check(d.get("kind") and d.get("apiVersion"),
                          f"{f}: a document without kind / apiVersion")
                    if d["kind"] != "Kustomization":
                        check(d.get("metadata", {}).get("name"),
                              f"{f}: {d['kind']} without metadata.name")
                    docs.setdefault(d["kind"], []).append((f, d))
            except yaml.YAMLError as e:
                raise Fail(f"{f}: {e}")
    return docs


def one(docs, kind):
    check(len(docs.get(kind, [])) == 1, f"expected one {kind}: "
          f"{[f for f, _ in docs.get(kind, [])]}")
    return docs[kind][0][1]


def subset(sel, labels, what):
    check(sel and all(labels.get(k) == v for k, v in sel.items()),
          f"{what}: selector {sel} does not match the pod labels {labels}")


def daemon_keys():
    out = subprocess.run([canopy_bin(), "serve", "--print-sample-config"],
                         capture_output=True, text=True, check=True).stdout
    keys = set()
    for line in out.splitlines():
        m = re.match(r"^(?:# )?([a-z][a-z0-9-]*) ", line)
        if m and not line.startswith("# ---"):
            keys.add(m.group(1))
    check("drain-grace-ms" in keys and "models-dir" in keys,
          f"cannot read keys from --print-sample-config: {sorted(keys)[:10]}")
    return keys


def conf_value(text, key):
    m = re.search(rf"^{re.escape(key)} (\S+)", text, re.M)
    return m.group(1) if m else None


def body(procs):
    if yaml is None:
        raise Skip("python3-yaml not installed (scripts/deps.sh)")
    k8s, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    docs = load_all(k8s)
    for kind in ("Deployment", "Service", "PodDisruptionBudget",
                 "HorizontalPodAutoscaler", "ConfigMap",
                 "PersistentVolumeClaim", "Kustomization"):
        check(kind in docs, f"no {kind} in {k8s}")
    kus = one(docs, "Kustomization")
    files = sorted(f for f in os.listdir(k8s) if f.endswith(".yaml")
                   and f != "kustomization.yaml")
    check(sorted(kus["resources"]) == files,
          f"kustomization resources {kus['resources']} != {files}")

    # The ConfigMap is config/canopy.conf, byte for byte.
    cm = one(docs, "ConfigMap")
    with open(os.path.join(root, "config", "canopy.conf")) as f:
        conf = f.read()
    check(cm["data"].get("canopy.conf") == conf, "configmap.yaml differs "
          "from config/canopy.conf: run deploy/k8s/gen-configmap.sh")

    dep = one(docs, "Deployment")
    spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    subset(spec["selector"]["matchLabels"], labels, "Deployment")
    subset(one(docs, "Service")["spec"]["selector"], labels, "Service")
    pdb = one(docs, "PodDisruptionBudget")
    subset(pdb["spec"]["selector"]["matchLabels"], labels, "PDB")
    hpa = one(docs, "HorizontalPodAutoscaler")
    tgt = hpa["spec"]["scaleTargetRef"]
    check(tgt["kind"] == "Deployment" and tgt["name"] ==
          dep["metadata"]["name"], f"HPA target {tgt}")
    check(hpa["spec"]["minReplicas"] >= 2 and hpa["spec"]["maxReplicas"] >
          hpa["spec"]["minReplicas"], "HPA replica bounds")
    # The PDB must leave a replica serving at the HPA's minimum.
    budget = pdb["spec"].get("maxUnavailable")
    if budget is None:
        budget = hpa["spec"]["minReplicas"] - pdb["spec"]["minAvailable"]
    check(0 < budget < hpa["spec"]["minReplicas"],
          f"PDB allows {budget} of {hpa['spec']['minReplicas']} down")

    check(len(pod["containers"]) == 1, "one container")
    c = pod["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    port = ports.get("http")
    check(port, "container port named http")
    svc_port = one(docs, "Service")["spec"]["ports"][0]
    check(svc_port["targetPort"] in ("http", port), "Service targetPort")
    # gRPC: the container port named grpc is the one --grpc-port opens,
    # and the Service passes it on marked as h2c (cleartext HTTP/2)
    gport = ports.get("grpc")
    check(gport, "container port named grpc")
    cargs = c.get("args", [])
    check("--grpc-port" in cargs and
          cargs[cargs.index("--grpc-port") + 1] == str(gport),
          f"--grpc-port in args is not the grpc container port {gport}")
    svc_grpc = [x for x in one(docs, "Service")["spec"]["ports"]
                if x["name"] == "grpc"]
    check(len(svc_grpc) == 1 and svc_grpc[0]["targetPort"] in
          ("grpc", gport) and svc_grpc[0].get("appProtocol") ==
          "kubernetes.io/h2c", f"Service port grpc (h2c): {svc_grpc}")

    def probe(name, path):
        p = c.get(name)
        check(p and p["httpGet"]["path"] == path, f"{name}: {path}")
        check(p["httpGet"]["port"] in ("http", port), f"{name} port")
    probe("readinessProbe", "/v2/health/ready")
    probe("livenessProbe", "/v2/health/live")
    pre = c["lifecycle"]["preStop"]
    if "sleep" in pre:
        pre_s = int(pre["sleep"]["seconds"])
    else:
        cmd = pre["exec"]["command"]
        check(cmd[0] == "sleep", f"preStop {cmd}")
        pre_s = int(cmd[1])
    check(pre_s >= 2, f"preStop sleep {pre_s} s: endpoints need time to drop")

    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    args = c.get("args", [])
    keys = daemon_keys()
    for name in env:
        if name in ENTRYPOINT_VARS:
            continue
        key = name[len("CANOPY_"):].lower().replace("_", "-")
        check(name.startswith("CANOPY_") and key in keys,
              f"env {name} is no daemon key")
    flags = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            check(a[2:] in keys, f"argument {a} is no daemon key")
            flags[a[2:]] = args[i + 1]
    grace_ms = int(flags.get("drain-grace-ms") or
                   env.get("CANOPY_DRAIN_GRACE_MS") or
                   conf_value(conf, "drain-grace-ms"))
    tgp = pod["terminationGracePeriodSeconds"]
    check(tgp > pre_s + grace_ms / 1e3 + 1, f"terminationGracePeriodSeconds "
          f"{tgp} <= preStop {pre_s} + drain grace {grace_ms / 1e3} + 1")
    res = c["resources"]
    for k in ("requests", "limits"):
        check("cpu" in res.get(k, {}) and "memory" in res.get(k, {}),
              f"resources.{k}: cpu and memory")
    cpus = float(str(res["requests"]["cpu"]).rstrip("m")) / (
        1000 if str(res["requests"]["cpu"]).endswith("m") else 1)
    workers = int(env.get("CANOPY_WORKERS") or conf_value(conf, "workers"))
    check(workers <= max(1, cpus), f"{workers} workers on {cpus} CPUs")

    # Volumes: config from the ConfigMap where --config points, models at
    # the entrypoint's mount point, a writable policy cache.
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    cfg_path = flags.get("config") or env.get("CANOPY_CONFIG")
    check(cfg_path, "--config or CANOPY_CONFIG")
    m = mounts.get(os.path.dirname(cfg_path))
    check(m and "configMap" in vols[m["name"]] and
          vols[m["name"]]["configMap"]["name"] == cm["metadata"]["name"],
          f"{cfg_path} is not on the ConfigMap volume")
    with open(os.path.join(root, "deploy/image/entrypoint.sh")) as f:
        mount_default = re.search(r"CANOPY_MODELS_MOUNT:-(\S+?)\}",
                                  f.read()).group(1)
    m = mounts.get(env.get("CANOPY_MODELS_MOUNT", mount_default))
    check(m, f"no volume at the models mount {mount_default}")
    pvcs = [d["metadata"]["name"] for _, d in docs["PersistentVolumeClaim"]]
    check(vols[m["name"]].get("persistentVolumeClaim", {}).get("claimName")
          in pvcs, "models volume: a PVC of models-pvc.yaml")
    cache = env.get("CANOPY_POLICY_CACHE")
    check(cache, "CANOPY_POLICY_CACHE")
    writable = [p for p, mm in mounts.items() if not mm.get("readOnly")
                and cache.startswith(p.rstrip("/") + "/")]
    check(writable and "emptyDir" in vols[mounts[writable[0]]["name"]],
          f"{cache} is not on a writable volume (readOnlyRootFilesystem)")
    sc = pod["securityContext"]
    with open(os.path.join(root, "Dockerfile")) as f:
        uid = re.search(r"^USER (\d+)", f.read(), re.M).group(1)
    check(sc.get("runAsNonRoot") and str(sc.get("runAsUser")) == uid,
          f"runAsUser {sc.get('runAsUser')} != the image's USER {uid}")
    ann = dep["spec"]["template"]["metadata"].get("annotations", {})
    check(str(ann.get("prometheus.io/port")) == str(port),
          "prometheus.io/port annotation")
    print(f"manifests: {sum(len(v) for v in docs.values())} documents; "
          f"terminationGracePeriodSeconds {tgp} > preStop {pre_s} + drain "
          f"{grace_ms / 1e3:g} + 1; {workers} workers on {cpus:g} CPUs")

    # The pod's process, outside a cluster: the entrypoint with the
    # container's args and env, the ConfigMap's file, a models volume.
    init_model(procs)
    cfg = os.path.join(procs.dir, "canopy.conf")
    with open(cfg, "w") as f:
        f.write(cm["data"]["canopy.conf"])
    hp, hg = free_port(), free_port()
    a = []
    for x in args:
        a.append({cfg_path: cfg, "0.0.0.0": "127.0.0.1",
                  str(port): str(hp),
                  str(gport): str(hg) if grpc_built() else "0"}.get(x, x))
    p = start_pod(procs, root, a, env, c, hp, 60)
    # the gRPC port takes a connection: an HTTP/2 preface is answered
    # with the server's SETTINGS frame (RFC 9113 section 3.4)
    if grpc_built():
        check_h2_settings(hg)
    else:
        print("gRPC port: not checked, this canopy has no gRPC front end")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    check(p.wait(tgp - pre_s) == 0, f"exit {p.returncode}")
    print(f"pod process: ready and live on the probes' paths; SIGTERM to "
          f"exit 0 in {(time.monotonic() - t0) * 1e3:.0f} ms (budget "
          f"{tgp - pre_s} s after preStop)")


def check_h2_settings(port):
    """An HTTP/2 client preface and empty SETTINGS to port; the first
    frame back must be the server's SETTINGS."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as g:
        g.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                  b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        head = b""
        while len(head) < 9:
            b = g.recv(9 - len(head))
            check(b, "the gRPC port closed without a SETTINGS frame")
            head += b
        check(head[3] == 4, f"the gRPC port's first frame is type {head[3]},"
              f" not SETTINGS")


if __name__ == "__main__":
    sys.exit(main(body, "deploy_k8s"))
