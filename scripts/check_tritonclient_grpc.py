#!/usr/bin/python3
"""check_tritonclient_grpc.py - runs NVIDIA's own `tritonclient.grpc`,
unchanged and with its defaults, against a running `canopy serve
--grpc-port`, for every model it serves, and compares each number of
every answer with /v1's for the same instances (the float32 /v1 prints,
bit for bit).

Opt-in, not part of `meson test`: the client is Triton's, not this
repository's, and Debian has no package of it. Put together its Python
sources (triton-inference-server/client, src/python/library) and stubs
generated from Triton's protos (triton-inference-server/common,
protobuf/*.proto) by Debian's python3-grpc-tools, as Triton's build
does:

  cd common/protobuf && python3 -m grpc_tools.protoc -I. \\
      --python_out=LIB/tritonclient/grpc --grpc_python_out=LIB/tritonclient/grpc \\
      grpc_service.proto model_config.proto health.proto
  cd LIB/tritonclient/grpc && mv grpc_service_pb2.py service_pb2.py \\
      && mv grpc_service_pb2_grpc.py service_pb2_grpc.py \\
      && sed -i 's/^import model_config_pb2 as/from tritonclient.grpc import model_config_pb2 as/; s/^import grpc_service_pb2 as/from tritonclient.grpc import service_pb2 as/' service_pb2*.py

then, with Debian's python3-grpcio, python3-numpy, python3-rapidjson and
python3-packaging:

  scripts/check_tritonclient_grpc.py --lib LIB --grpc 127.0.0.1:8001 \\
      --http 127.0.0.1:8080

Each call is one line: model, call, ok or the exception. Exit 0 when
every call of every model worked and matched /v1; 1 otherwise.
"""
import argparse
import json
import os
import queue
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from test_kserve import as_f32, expected, per_row_names, split  # noqa: E402

# instances a model of each input kind is asked, from data/
DATA_OF = {"tree": "trees-nary.jsonl", "sequence": "sequences.jsonl",
           "lattice": "lattices.jsonl", "dag": "dags.jsonl"}
N = 4


def http_json(base, path, body=None):
    req = urllib.request.Request(base + path, data=None if body is None
                                 else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def instances(kind, family):
    """N instances of the input kind from data/ (binary families get
    binary trees)."""
    name = DATA_OF[kind]
    if kind == "tree" and family != "childsum-treelstm":
        name = "trees-binary.jsonl"
    with open(os.path.join(ROOT, "data", name)) as f:
        return [json.loads(next(f)) for _ in range(N)]


def per_instance(result, response_names, n, family, kind):
    """The InferResult cut back into instances (docs/api.md: OFFSETS)."""
    import numpy as np
    outs = []
    for name in response_names:
        a = result.as_numpy(name)
        if a.dtype == np.object_:
            data = [x.decode() if isinstance(x, bytes) else x
                    for x in a.reshape(-1)]
        else:
            data = a.reshape(-1).tolist()
        outs.append({"name": name, "shape": list(a.shape), "data": data})
    return split({"outputs": outs}, n, per_row_names(family, kind, {}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True,
                    help="the folder holding tritonclient/ with its stubs")
    ap.add_argument("--grpc", default="127.0.0.1:8001")
    ap.add_argument("--http", default="127.0.0.1:8080")
    args = ap.parse_args()
    sys.path.insert(0, args.lib)
    import numpy as np
    import tritonclient.grpc as tg

    base = "http://" + args.http
    client = tg.InferenceServerClient(url=args.grpc)
    failures = []

    def check(model, call, fn):
        try:
            fn()
            print("%-14s %-26s ok" % (model, call))
        except Exception as e:  # noqa: BLE001 (every failure is reported)
            msg = "%s: %s" % (type(e).__name__, e)
            print("%-14s %-26s FAIL %s" % (model, call, msg))
            failures.append((model, call, msg))

    def server_calls():
        assert client.is_server_live() is True
        assert client.is_server_ready() is True
        m = client.get_server_metadata(as_json=True)
        assert m["name"] == "canopy", m
        idx = client.get_model_repository_index(as_json=True)
        assert idx.get("models"), idx

    check("-", "server live/ready/meta/index", server_calls)
    models = http_json(base, "/v1/models")["models"]
    for m in models:
        name, family, kind = m["name"], m["family"], m["input"]
        insts = instances(kind, family)
        opts = {"max_decode_len": 8} if family == "lstm-nmt" else {}
        ref = http_json(base, "/v1/models/%s/infer" % name,
                        dict(opts, instances=insts))

        def ready():
            assert client.is_model_ready(name) is True
            assert client.is_model_ready(name, ref["model_version"]) is True

        def metadata():
            md = client.get_model_metadata(name, as_json=True)
            want = http_json(base, "/v2/models/" + name)
            assert md["name"] == name and md["versions"] == want["versions"]
            assert [o["name"] for o in md["outputs"]] == \
                [o["name"] for o in want["outputs"]], md

        def config():
            c = client.get_model_config(name, as_json=True)["config"]
            want = http_json(base, "/v2/models/%s/config" % name)
            assert c["name"] == name and \
                int(c["max_batch_size"]) == want["max_batch_size"], c

        def infer_input():
            i = tg.InferInput("INSTANCE", [len(insts)], "BYTES")
            i.set_data_from_numpy(np.array(
                [json.dumps(x).encode() for x in insts], dtype=np.object_))
            return [i]

        def params():
            return opts or None

        def compare(result):
            resp = result.get_response(as_json=True)
            assert resp["model_name"] == name, resp.get("model_name")
            names = [o["name"] for o in resp["outputs"]]
            per = per_instance(result, names, len(insts), family, kind)
            for k, (got, v1) in enumerate(zip(per, ref["outputs"])):
                want = {key: as_f32(v) if key in ("LOGITS", "HIDDEN",
                                                  "PATH_SCORE") else v
                        for key, v in expected(v1).items()}
                assert got == want, "instance %d: %r != %r" % (k, got, want)

        def infer():
            compare(client.infer(name, infer_input(), parameters=params()))

        def async_infer():
            done = queue.Queue()
            client.async_infer(name, infer_input(),
                               lambda result, error: done.put((result, error)),
                               parameters=params())
            result, error = done.get(timeout=60)
            if error is not None:
                raise error
            compare(result)

        def stats():
            before = client.get_inference_statistics(name, as_json=True)
            client.infer(name, infer_input(), parameters=params())
            after = client.get_inference_statistics(name, as_json=True)
            b, a = before["model_stats"][0], after["model_stats"][0]
            assert int(a.get("inference_count", 0)) == \
                int(b.get("inference_count", 0)) + len(insts), (b, a)

        for call, fn in (("is_model_ready", ready),
                         ("get_model_metadata", metadata),
                         ("get_model_config", config),
                         ("infer", infer), ("async_infer", async_infer),
                         ("get_inference_statistics", stats)):
            check(name, call, fn)
    client.close()
    print("%d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
