"""test_kserve.py - deploy/kserve/servingruntime.yaml (REST) or
servingruntime-grpc.yaml (gRPC): the fields
KServe's documentation of ServingRuntime requires or relies on, and the
pod's process run once outside a cluster. No cluster ran it (none here);
scripts/validate_kserve_runtime.py checks the file against KServe's CRD
schema when given that CRD.

From KServe's documentation (Serving Runtimes; the InferenceService's
storageUri; the Open Inference Protocol):
- apiVersion serving.kserve.io/v1alpha1, kind ServingRuntime, a name;
- spec.containers (the one field the spec requires), each with a name;
  the runtime's main container is `kserve-container`, the one KServe
  merges the InferenceService's predictor into;
- spec.supportedModelFormats: entries with a name (required), version a
  string, autoSelect a boolean, priority (an integer >= 1) only with
  autoSelect;
- spec.protocolVersions from v1, v2, grpc-v1, grpc-v2: [v2], the Open
  Inference Protocol over REST, which the daemon serves under /v2, or
  [grpc-v2], the protocol over gRPC (inference.GRPCInferenceService);
- the model: the storage initializer puts the storageUri's content at
  /mnt/models, so that is what the entrypoint serves;
- one container port (Knative allows one): for v2 the HTTP port, the
  probes on it at the protocol's health routes; for grpc-v2 the gRPC port
  named h2c (KServe and Knative route HTTP/2 to a port so named), the
  probes on the HTTP port (Knative >= 1.3 allows a probe on another port).
Then: every CANOPY_* variable is a daemon key (or the entrypoint's), the
user is the image's, and the entrypoint with the container's environment
and a models directory standing for /mnt/models answers the probes, the
model's v2 ready route and a v2 inference equal to `canopy run`'s (for
grpc-v2, a gRPC ModelInfer on the h2c port too, with python3-grpcio), and
exits 0 on SIGTERM.

usage: test_kserve.py RUNTIME_YAML REPO_ROOT   (CANOPY_BIN, CANOPY_DATA)
"""
import json
import os
import re
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploylib import (Skip, check, data_dir,  # noqa: E402
                       expected_outputs, free_port, grpc_built, init_model,
                       main, near, request, start_pod)
from test_k8s import ENTRYPOINT_VARS, daemon_keys  # noqa: E402

try:
    import yaml
except ImportError:
    yaml = None

PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
STORAGE_MOUNT = "/mnt/models"


def check_runtime(rt, root):
    """The fields; returns (container, env, port)."""
    check(rt.get("apiVersion") == "serving.kserve.io/v1alpha1",
          f"apiVersion {rt.get('apiVersion')}")
    check(rt.get("kind") == "ServingRuntime", f"kind {rt.get('kind')}")
    check(rt.get("metadata", {}).get("name"), "metadata.name")
    spec = rt["spec"]
    fmts = spec.get("supportedModelFormats")
    check(isinstance(fmts, list) and fmts, "supportedModelFormats: a list")
    for f in fmts:
        check(isinstance(f.get("name"), str) and f["name"],
              f"supportedModelFormats: an entry without name: {f}")
        check(isinstance(f.get("version", ""), str),
              f"supportedModelFormats {f['name']}: version must be a string")
        check(isinstance(f.get("autoSelect", False), bool),
              f"supportedModelFormats {f['name']}: autoSelect is a boolean")
        if "priority" in f:
            check(f.get("autoSelect") is True and isinstance(
                f["priority"], int) and f["priority"] >= 1,
                f"supportedModelFormats {f['name']}: priority >= 1 needs "
                "autoSelect true")
    pv = spec.get("protocolVersions")
    check(pv in (["v2"], ["grpc-v2"]) and set(pv) <= PROTOCOLS,
          f"protocolVersions {pv}")
    grpc_rt = pv == ["grpc-v2"]
    check(spec.get("multiModel", False) is False and "builtInAdapter" not in
          spec, "not a ModelMesh runtime")
    cs = spec.get("containers")
    check(isinstance(cs, list) and len(cs) == 1, "one container")
    c = cs[0]
    check(c.get("name") == "kserve-container",
          f"container name {c.get('name')}: KServe merges the predictor "
          "into kserve-container")
    check(c.get("image"), "container image")
    ports = c.get("ports", [])
    check(len(ports) == 1, f"one container port (Knative): {ports}")
    port = ports[0]["containerPort"]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    keys = daemon_keys()
    for name in env:
        key = name[len("CANOPY_"):].lower().replace("_", "-")
        check(name in ENTRYPOINT_VARS or (name.startswith("CANOPY_") and
                                          key in keys),
              f"env {name} is no daemon key")
    if grpc_rt:
        check(ports[0].get("name") == "h2c", f"the gRPC port's name "
              f"{ports[0].get('name')}: h2c routes HTTP/2 to it")
        check(env.get("CANOPY_GRPC_PORT") == str(port),
              f"CANOPY_GRPC_PORT {env.get('CANOPY_GRPC_PORT')} != "
              f"containerPort {port}")
        http_port = int(env.get("CANOPY_PORT") or 0)
        check(http_port and http_port != port, f"CANOPY_PORT {http_port}: "
              "the probes' HTTP port")
    else:
        check(env.get("CANOPY_PORT") == str(port),
              f"CANOPY_PORT {env.get('CANOPY_PORT')} != containerPort {port}")
        http_port = port
    check(env.get("CANOPY_HOST") == "0.0.0.0", "CANOPY_HOST 0.0.0.0")
    check(not any(a.startswith(("--port", "--grpc-port", "--host",
                                "--models-dir"))
                  for a in c.get("args", [])),
          "args set what the environment sets")
    check(env.get("CANOPY_MODELS_MOUNT") == STORAGE_MOUNT,
          f"CANOPY_MODELS_MOUNT {env.get('CANOPY_MODELS_MOUNT')}: the "
          f"storage initializer's {STORAGE_MOUNT}")
    check(env.get("CANOPY_REQUIRE_MODELS") == "1",
          "CANOPY_REQUIRE_MODELS=1: never the demo models by mistake")
    for name, path in (("readinessProbe", "/v2/health/ready"),
                       ("livenessProbe", "/v2/health/live")):
        p = c.get(name)
        check(p and p["httpGet"]["path"] == path and p["httpGet"].get(
            "port", port) == http_port, f"{name}: GET {path} on {http_port}")
    for k in ("requests", "limits"):
        r = c.get("resources", {}).get(k, {})
        check("cpu" in r and "memory" in r, f"resources.{k}: cpu, memory")
    with open(os.path.join(root, "Dockerfile")) as f:
        uid = re.search(r"^USER (\d+)", f.read(), re.M).group(1)
    sc = c.get("securityContext", {})
    check(sc.get("runAsNonRoot") and str(sc.get("runAsUser")) == uid,
          f"runAsUser {sc.get('runAsUser')} != the image's USER {uid}")
    return c, env, port, grpc_rt


def body(procs):
    if yaml is None:
        raise Skip("python3-yaml not installed (scripts/deps.sh)")
    path, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    check(len(docs) == 1, f"{path}: {len(docs)} documents, expected one")
    c, env, port, grpc_rt = check_runtime(docs[0], root)
    if grpc_rt and not grpc_built():
        raise Skip("a grpc-v2 runtime, and this canopy has no gRPC front "
                   "end (meson -Dgrpc)")
    print(f"runtime: {docs[0]['metadata']['name']}, formats "
          f"{[f['name'] for f in docs[0]['spec']['supportedModelFormats']]}"
          f", protocols {docs[0]['spec']['protocolVersions']}, port {port}, "
          f"models at {env['CANOPY_MODELS_MOUNT']}")

    # The pod's process: what the storage initializer leaves at
    # /mnt/models is a directory of model directories.
    mdir = init_model(procs)
    hp, hg = free_port(), free_port()
    e = dict(env, CANOPY_HOST="127.0.0.1", CANOPY_PORT=str(hp),
             CANOPY_GRPC_PORT=str(hg) if grpc_rt else "0")
    p = start_pod(procs, root, c.get("args", []), e, c, hp, 20)
    name = os.path.basename(mdir)
    check(request(hp, "GET", f"/v2/models/{name}/ready")[0] == 200,
          f"/v2/models/{name}/ready")
    with open(os.path.join(data_dir(), "trees-binary.jsonl")) as f:
        lines = [next(f) for _ in range(3)]
    want = expected_outputs(procs, mdir, lines)
    req = {"inputs": [{"name": "INSTANCE", "datatype": "BYTES",
                       "shape": [len(lines)],
                       "data": [x.strip() for x in lines]}]}
    st, _, b = request(hp, "POST", f"/v2/models/{name}/infer",
                       json.dumps(req).encode(),
                       {"Content-Type": "application/json"})
    check(st == 200, f"v2 infer: {st} {b[:300]!r}")
    outs = {o["name"]: o for o in json.loads(b)["outputs"]}
    check("LOGITS" in outs, f"v2 infer outputs: {sorted(outs)}")
    flat = [x for w in want for x in w["logits"]]
    near(outs["LOGITS"]["data"], flat, where="LOGITS")
    if grpc_rt:
        grpc_infer(procs, root, hg, name, lines, flat)
    p.send_signal(signal.SIGTERM)
    check(p.wait(20) == 0, f"exit {p.returncode}:\n{procs.log(p)}")
    print(f"pod process: the probes, /v2/models/{name}/ready and a v2 "
          "inference (equal to canopy run's) answered; SIGTERM: exit 0")


def grpc_infer(procs, root, port, name, lines, flat):
    """A gRPC ModelInfer on the runtime's h2c port, with stubs generated
    from server/grpc_service.proto: LOGITS equal to `canopy run`'s."""
    try:
        import grpc
        import grpc_tools  # noqa: F401
    except ImportError as e:
        print(f"gRPC inference: skipped, python3-grpcio or python3-grpc-tools"
              f" missing ({e})")
        return
    import struct
    sys.path.insert(0, os.path.join(root, "tests", "python"))
    from test_grpc import generate_stubs
    pb, rpc = generate_stubs(procs.dir)
    req = pb.ModelInferRequest(model_name=name)
    req.inputs.add(name="INSTANCE", datatype="BYTES", shape=[len(lines)])
    req.raw_input_contents.append(b"".join(
        struct.pack("<I", len(x.strip().encode())) + x.strip().encode()
        for x in lines))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        resp = rpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
    names = [t.name for t in resp.outputs]
    check("LOGITS" in names, f"gRPC infer outputs: {names}")
    raw = resp.raw_output_contents[names.index("LOGITS")]
    near(list(struct.unpack(f"<{len(raw) // 4}f", raw)), flat,
         where="gRPC LOGITS")
    print(f"pod process: a gRPC ModelInfer on the h2c port (equal to "
          f"canopy run's)")


if __name__ == "__main__":
    sys.exit(main(body, "deploy_kserve"))
