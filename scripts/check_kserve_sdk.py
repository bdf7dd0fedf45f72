#!/usr/bin/python3
"""check_kserve_sdk.py - runs the KServe Python SDK's own inference
clients, `InferenceRESTClient` (Open Inference Protocol v2 over HTTP) and
`InferenceGRPCClient` (v2 over gRPC), unchanged and with their defaults,
against a running `canopy serve --grpc-port`, for every model it serves,
and compares each number of every answer with /v1's for the same
instances (the float32 /v1 prints, bit for bit).

Opt-in, not part of `meson test`: the SDK is KServe's, not this
repository's, and Debian has no package of it. Its sources are
kserve/kserve's python/kserve folder (the `kserve` package inside it is
what --sdk names). Its client side needs these Debian packages:

  apt-get install python3-httpx python3-pydantic python3-numpy \\
      python3-pandas python3-protobuf python3-grpcio python3-grpc-tools \\
      python3-yaml python3-psutil python3-fastapi

The SDK's generated gRPC stubs come from grpcio-tools 1.64 and pass
`_registered_method`, which Debian's python3-grpcio (1.51) rejects; as
the stubs' own warning advises, generate them again from the SDK's own
.proto with Debian's python3-grpc-tools, the way the SDK makes them:

  cd SDK/kserve/protocol/grpc && python3 -m grpc_tools.protoc -I. \\
      --python_out=. --grpc_python_out=. grpc_predict_v2.proto \\
      && sed -i 's/^import grpc_predict_v2_pb2 as/from kserve.protocol.grpc import grpc_predict_v2_pb2 as/' \\
             grpc_predict_v2_pb2_grpc.py

then:

  scripts/check_kserve_sdk.py --sdk SDK --grpc 127.0.0.1:8001 \\
      --http 127.0.0.1:8080

Three things are put in place around the SDK, and each is printed when
used (nothing of the SDK's own code is replaced):
- `kserve/__init__.py` imports the model-server side too (FastAPI app,
  uvicorn, prometheus, kubernetes models); the client modules are
  imported without running it, as the package's submodules.
- `cloudevents` (not in Debian) is imported by kserve/utils/utils.py only
  for the model server's CloudEvent encoding; where it is missing, a
  module whose names raise when called stands in.
- `orjson` (packaged in Debian only from trixie on) is what the clients
  encode and decode JSON with; where it is missing, the standard
  library's json stands in with orjson's contract for what the clients
  use: dumps to compact UTF-8 bytes, loads from bytes, JSONDecodeError.

The SDK clients have no metadata calls; ServerMetadata and ModelMetadata
are called through the SDK's own generated gRPC stub (the one its
InferenceGRPCClient holds). Each call is one line: model, transport,
call, ok or the exception. Exit 0 when every call of every model worked
and matched /v1; 1 otherwise.
"""
import argparse
import asyncio
import json
import os
import sys
import types
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from test_kserve import as_f32, expected, per_row_names, split  # noqa: E402

# instances a model of each input kind is asked, from data/
DATA_OF = {"tree": "trees-binary.jsonl", "sequence": "sequences.jsonl",
           "lattice": "lattices.jsonl", "dag": "dags.jsonl"}
N = 4


def http_json(base, path, body=None):
    req = urllib.request.Request(base + path, data=None if body is None
                                 else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def instances(kind, family):
    """N instances of the input kind (n-ary trees for the child-sum
    family), from data/ or the sample in scripts/demo-data/."""
    name = DATA_OF[kind]
    if kind == "tree" and family == "childsum-treelstm":
        name = "trees-nary.jsonl"
    path = os.path.join(ROOT, "data", name)
    if not os.path.exists(path):
        path = os.path.join(HERE, "demo-data", name)
    with open(path) as f:
        return [json.loads(next(f)) for _ in range(N)]


def import_sdk(sdk):
    """The SDK's client modules, from the folder holding kserve/, with
    the stand-ins the module comment lists (each announced)."""
    try:
        import orjson  # noqa: F401
    except ImportError:
        print("note: orjson missing: the standard library's json stands in")
        o = types.ModuleType("orjson")
        o.JSONDecodeError = json.JSONDecodeError
        o.dumps = lambda obj, default=None, option=None: json.dumps(
            obj, default=default, ensure_ascii=False,
            separators=(",", ":")).encode()
        o.loads = json.loads
        o.orjson = o  # `from orjson import orjson` (the extension module)
        sys.modules["orjson"] = o
    try:
        import cloudevents.http  # noqa: F401
        import cloudevents.conversion  # noqa: F401
    except ImportError:
        print("note: cloudevents missing: a server-side-only stand-in")

        def server_side_only(*a, **k):
            raise NotImplementedError("cloudevents is not installed")
        for n in ("cloudevents", "cloudevents.conversion", "cloudevents.http"):
            m = types.ModuleType(n)
            m.to_binary = m.to_structured = m.CloudEvent = server_side_only
            sys.modules[n] = m
    print("note: kserve/__init__.py (model server side) not run")
    pkg = types.ModuleType("kserve")
    pkg.__path__ = [os.path.join(os.path.abspath(sdk), "kserve")]
    sys.modules["kserve"] = pkg
    import kserve.inference_client as ic
    import kserve.protocol.infer_type as it
    import kserve.protocol.grpc.grpc_predict_v2_pb2 as pb
    return ic, it, pb


def per_instance(response, n, family, kind):
    """An InferResponse cut back into instances (docs/api.md: OFFSETS)."""
    import numpy as np
    outs = []
    for o in response.outputs:
        a = o.as_numpy()
        if a.dtype == np.object_:
            data = [x.decode() if isinstance(x, bytes) else x
                    for x in a.reshape(-1)]
        else:
            data = a.reshape(-1).tolist()
        outs.append({"name": o.name, "shape": list(a.shape), "data": data})
    return split({"outputs": outs}, n, per_row_names(family, kind, {}))


async def run(args):
    ic, it, pb = import_sdk(args.sdk)
    import numpy as np
    base = "http://" + args.http
    rest = ic.InferenceRESTClient(ic.RESTConfig(protocol="v2"))
    grpcc = ic.InferenceGRPCClient(args.grpc)
    stub = grpcc._client_stub  # the SDK's GRPCInferenceServiceStub
    failures = []

    async def check(model, transport, call, fn):
        try:
            await fn()
            print("%-18s %-5s %-32s ok" % (model, transport, call))
        except Exception as e:  # noqa: BLE001 (every failure is reported)
            msg = "%s: %s" % (type(e).__name__, e)
            print("%-18s %-5s %-32s FAIL %s" % (model, transport, call, msg))
            failures.append((model, transport, call, msg))

    async def rest_server():
        assert await rest.is_server_live(base) is True
        assert await rest.is_server_ready(base) is True

    async def grpc_server():
        assert await grpcc.is_server_live() is True
        assert await grpcc.is_server_ready() is True

    async def grpc_server_metadata():
        m = await stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=60)
        want = http_json(base, "/v2")
        assert m.name == want["name"] and m.version == want["version"], m
        assert list(m.extensions) == want["extensions"], m

    async def unknown_model():
        assert await rest.is_model_ready(base, "no-such-model") is False
        try:
            await rest.infer(base, it.InferRequest(
                "no-such-model", [it.InferInput("INSTANCE", [1], "BYTES",
                                                ["{}"])]),
                model_name="no-such-model")
        except Exception as e:  # noqa: BLE001
            assert e.response.status_code == 404, e
            assert isinstance(e.response.json()["error"], str), e
        else:
            raise AssertionError("infer of an unknown model succeeded")

    await check("-", "REST", "is_server_live/ready", rest_server)
    await check("-", "REST", "unknown model", unknown_model)
    await check("-", "gRPC", "is_server_live/ready", grpc_server)
    await check("-", "gRPC", "ServerMetadata (stub)", grpc_server_metadata)

    for m in http_json(base, "/v1/models")["models"]:
        name, family, kind = m["name"], m["family"], m["input"]
        insts = instances(kind, family)
        opts = {"max_decode_len": 8} if family == "lstm-nmt" else {}
        ref = http_json(base, "/v1/models/%s/infer" % name,
                        dict(opts, instances=insts))
        texts = [json.dumps(x) for x in insts]

        def request(binary, column=False, version=None, params=None):
            """The request as the SDK's documentation writes one: a BYTES
            input from a list (JSON / bytes_contents) or from numpy
            (binary data / raw_input_contents, the default); shape [N] or
            [N, 1]; the version named or not."""
            shape = [len(insts), 1] if column else [len(insts)]
            if binary:
                i = it.InferInput("INSTANCE", shape, "BYTES")
                i.set_data_from_numpy(np.array(
                    [t.encode() for t in texts], dtype=np.object_)
                    .reshape(shape))
            else:
                i = it.InferInput("INSTANCE", shape, "BYTES", list(texts))
            return it.InferRequest(model_name=name, infer_inputs=[i],
                                   model_version=version,
                                   parameters=dict(opts, **(params or {}))
                                   or None)

        def compare(resp):
            assert resp.model_name == name, resp.model_name
            per = per_instance(resp, len(insts), family, kind)
            for k, (got, v1) in enumerate(zip(per, ref["outputs"])):
                want = {key: as_f32(v) if key in ("LOGITS", "HIDDEN",
                                                  "PATH_SCORE") else v
                        for key, v in expected(v1).items()}
                assert got == want, "instance %d: %r != %r" % (k, got, want)

        async def rest_ready():
            assert await rest.is_model_ready(base, name) is True

        async def rest_infer_json():
            compare(await rest.infer(base, request(False), model_name=name))

        async def rest_infer_binary():
            compare(await rest.infer(base, request(True), model_name=name))

        async def rest_infer_binary_out():
            compare(await rest.infer(
                base, request(True, True, ref["model_version"],
                              {"binary_data_output": True}),
                model_name=name))

        async def grpc_ready():
            assert await grpcc.is_model_ready(name) is True

        async def grpc_metadata():
            md = await stub.ModelMetadata(pb.ModelMetadataRequest(name=name),
                                          timeout=60)
            want = http_json(base, "/v2/models/" + name)
            assert md.name == name and list(md.versions) == want["versions"]
            assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] \
                == [(t["name"], t["datatype"], t["shape"])
                    for t in want["inputs"]], md
            assert [(t.name, t.datatype, list(t.shape)) for t in md.outputs] \
                == [(t["name"], t["datatype"], t["shape"])
                    for t in want["outputs"]], md

        async def grpc_infer_contents():
            compare(await grpcc.infer(request(False)))

        async def grpc_infer_raw():
            compare(await grpcc.infer(request(True)))

        async def grpc_infer_version():
            compare(await grpcc.infer(request(True, True,
                                              ref["model_version"])))

        for transport, call, fn in (
                ("REST", "is_model_ready", rest_ready),
                ("REST", "infer (JSON)", rest_infer_json),
                ("REST", "infer (binary)", rest_infer_binary),
                ("REST", "infer (version, [N,1], bin out)",
                 rest_infer_binary_out),
                ("gRPC", "is_model_ready", grpc_ready),
                ("gRPC", "ModelMetadata (stub)", grpc_metadata),
                ("gRPC", "infer (bytes_contents)", grpc_infer_contents),
                ("gRPC", "infer (raw_input)", grpc_infer_raw),
                ("gRPC", "infer (version, [N,1])", grpc_infer_version)):
            await check(name, transport, call, fn)
    await rest.close()
    await grpcc.close()
    print("%d failures" % len(failures))
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sdk", required=True,
                    help="KServe's python/kserve folder (holding kserve/)")
    ap.add_argument("--grpc", default="127.0.0.1:8001")
    ap.add_argument("--http", default="127.0.0.1:8080")
    return asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
