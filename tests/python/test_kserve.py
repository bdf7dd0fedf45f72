"""The Open Inference Protocol (KServe v2) over HTTP (docs/api.md "Open
Inference Protocol") against a real `canopy serve` on a free port, with a
client written from the protocol's text (http.client and json only):
server and model metadata, inference for every family the tests build
compared instance by instance with /v1's answers (the same floats, bit for
bit: the cpu backend is batch-invariant), the request id, versions in the
path, asked-for outputs, and the protocol's errors. Then Triton's
extensions as its documents spell them, with bodies built by hand
(struct, gzip, zlib): binary tensor data both ways (a JSON header of
Inference-Header-Content-Length bytes, then the tensors' little-endian
bytes, BYTES elements length-prefixed), classification ("value:index:label"
of each row's top K), compressed bodies and answers (a zip bomb is 413),
and INSTANCE shaped [N, 1].

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_kserve.py
(env CANOPY_BIN, CANOPY_DATA, CANOPY_CELLS as for the other tests).
"""
import gzip
import http.client
import json
import os
import struct
import zlib
import shutil
import subprocess
import tempfile
import threading
import time
import unittest
from daemon_util import BIN, DATA, ROOT, free_port

CELLS = os.environ.get("CANOPY_CELLS", os.path.join(ROOT, "tests", "cells"))

# name: (family, data file, extra `model init` flags, /v1 options sent)
MODELS = {
    "treelstm": ("treelstm", "trees-binary.jsonl", [], {}),
    "childsum": ("childsum-treelstm", "trees-nary.jsonl", [],
                 {"outputs": "all"}),
    "mvrnn": ("mvrnn", "trees-binary.jsonl", [], {}),
    "tagger": ("bilstm-tagger", "sequences.jsonl", [], {}),
    "crf": ("bilstm-tagger", "sequences.jsonl", ["--crf"], {}),
    "latticelstm": ("latticelstm", "lattices.jsonl", ["--lexicon"], {}),
    "latticegru": ("latticegru", "dags.jsonl", [], {}),
    "nmt": ("lstm-nmt", "sequences.jsonl", [], {"max_decode_len": 8}),
}
# described by cells (tests/cells) on a built-in's weights, H 16, D 12
CELL_MODELS = {"cells-bilstm": ("bilstm-tagger", "sequences.jsonl",
                                "bilstm-tagger.json"),
               "cells-treelstm": ("treelstm", "trees-binary.jsonl",
                                  "treelstm.json")}
N = 5  # instances a request
# the daemon's batching, as the model configuration must say it
MAX_DELAY_US = 1500
MAX_PER_REQUEST = 1024


def f32(x):
    """x as the float32 it rounds to (binary FP32 data holds that)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def as_f32(v):
    if isinstance(v, list):
        return [as_f32(x) for x in v]
    return f32(v) if isinstance(v, float) or isinstance(v, int) else v


def pack_elements(elements):
    """BYTES elements as binary data: a 4-byte little-endian length each,
    then its bytes (Triton's binary tensor data extension)."""
    return b"".join(struct.pack("<I", len(b)) + b for b in elements)


def unpack_tensor(dtype, raw):
    """Binary tensor data back into a flat list, by its datatype."""
    if dtype == "FP32":
        assert len(raw) % 4 == 0
        return list(struct.unpack("<%df" % (len(raw) // 4), raw))
    if dtype == "INT64":
        assert len(raw) % 8 == 0
        return list(struct.unpack("<%dq" % (len(raw) // 8), raw))
    assert dtype == "BYTES", dtype
    out, off = [], 0
    while off < len(raw):
        n, = struct.unpack_from("<I", raw, off)
        out.append(raw[off + 4:off + 4 + n].decode())
        off += 4 + n
    assert off == len(raw)
    return out


def decode_answer(headers, raw):
    """A v2 answer as the extension describes it: inflated per
    Content-Encoding; with Inference-Header-Content-Length, its JSON then
    each tensor's binary data in the order of "outputs" (each such tensor
    gets "data" back and is marked "binary")."""
    enc = headers.get("content-encoding")
    if enc == "gzip":
        raw = gzip.decompress(raw)
    elif enc == "deflate":
        raw = zlib.decompress(raw)
    else:
        assert enc is None, enc
    hl = headers.get("inference-header-content-length")
    if hl is None:
        return json.loads(raw)
    hl = int(hl)
    r = json.loads(raw[:hl])
    off = hl
    for t in r.get("outputs", []):
        size = t.get("parameters", {}).get("binary_data_size")
        if size is None:
            continue
        assert "data" not in t, t["name"]
        t["data"] = unpack_tensor(t["datatype"], raw[off:off + size])
        t["binary"] = True
        del t["parameters"]
        off += size
    assert off == len(raw), (off, len(raw))
    return r


def head(path, n):
    with open(path) as f:
        return [json.loads(next(f)) for _ in range(n)]


def as_cells_model(d, desc):
    """Makes the model `canopy model init` left in d a cells model: its
    model.json becomes the description tests/cells/desc, keeping the labels
    init wrote where the description has none."""
    with open(os.path.join(d, "model.json")) as f:
        labels = json.load(f).get("labels")
    with open(os.path.join(CELLS, desc)) as f:
        j = json.load(f)
    if labels and "labels" not in j:
        j["labels"] = labels
    with open(os.path.join(d, "model.json"), "w") as f:
        json.dump(j, f)


class Client:
    """A v2 REST client from the protocol's text: JSON bodies, the HTTP
    status, {"error": string} on failure."""

    def __init__(self, port):
        self.port = port

    def call(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        c.request(method, path, body=body,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        c.close()
        return r.status, json.loads(raw) if raw else None

    def raw(self, method, path, body, headers):
        """The status, the headers (lower-case names) and the body's
        bytes as sent."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        raw = r.read()
        c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, raw

    def infer_binary(self, model, instances, shape=None, parameters=None,
                     outputs=None, compress=None, accept=None):
        """As tritonclient sends by default: INSTANCE as binary data after
        the JSON header. Returns the status, the headers and the decoded
        answer."""
        els = pack_elements(json.dumps(i).encode() for i in instances)
        head = {"inputs": [{"name": "INSTANCE", "datatype": "BYTES",
                            "shape": shape or [len(instances)],
                            "parameters": {"binary_data_size": len(els)}}]}
        if parameters:
            head["parameters"] = parameters
        if outputs is not None:
            head["outputs"] = outputs
        h = json.dumps(head).encode()
        return self.send_v2(model, h + els, len(h), compress, accept)

    def send_v2(self, model, body, header_len=None, compress=None,
                accept=None, path=None):
        headers = {"Content-Type": "application/octet-stream"}
        if header_len is not None:
            headers["Inference-Header-Content-Length"] = str(header_len)
        if compress == "gzip":
            body = gzip.compress(body)
        elif compress == "deflate":
            body = zlib.compress(body)
        if compress:
            headers["Content-Encoding"] = compress
        if accept:
            headers["Accept-Encoding"] = accept
        st, rh, raw = self.raw("POST", path or
                               "/v2/models/%s/infer" % model, body, headers)
        return st, rh, decode_answer(rh, raw) if raw else None

    def infer(self, model, instances, parameters=None, outputs=None,
              request_id=None, version=None):
        """instances: /v1 INSTANCE objects, sent as BYTES elements."""
        body = {"inputs": [{"name": "INSTANCE", "datatype": "BYTES",
                            "shape": [len(instances)],
                            "data": [json.dumps(i) for i in instances]}]}
        if parameters:
            body["parameters"] = parameters
        if outputs is not None:
            body["outputs"] = [{"name": o} for o in outputs]
        if request_id is not None:
            body["id"] = request_id
        path = "/v2/models/" + model
        if version is not None:
            path += "/versions/" + version
        return self.call("POST", path + "/infer", body)


def per_row_names(family, input_kind, options):
    """Which tensors follow OFFSETS (docs/api.md): a decoder's tokens;
    LOGITS and LABEL of per-token models (sequences, lattices) and of trees
    with outputs "all"; HIDDEN of per-token models. The rest: one row an
    instance."""
    if family == "lstm-nmt":
        return {"OUTPUT_TOKENS"}
    if input_kind in ("sequence", "lattice"):
        return {"LOGITS", "LABEL", "HIDDEN"}
    if input_kind == "tree" and options.get("outputs") == "all":
        return {"LOGITS", "LABEL"}
    return set()


def split(resp, n, per_row):
    """A v2 answer's tensors cut back into instances: the rows of instance
    i of a tensor in per_row are OFFSETS[i] .. OFFSETS[i+1] (a list of
    rows), of any other its row i. A row is a list when the tensor is
    2-D, else one element."""
    outs = {t["name"]: t for t in resp["outputs"]}
    offs = outs.pop("OFFSETS", None)
    per = [dict() for _ in range(n)]
    for name, t in outs.items():
        shape, data = t["shape"], t["data"]
        assert len(data) == (shape[0] * shape[1] if len(shape) == 2
                             else shape[0]), name
        rows = ([data[r * shape[1]:(r + 1) * shape[1]]
                 for r in range(shape[0])] if len(shape) == 2 else data)
        if name in per_row:
            o = offs["data"]
            assert offs["shape"] == [n + 1] and o[-1] == shape[0], name
            for i in range(n):
                per[i][name] = rows[o[i]:o[i + 1]]
        else:
            assert shape[0] == n, (name, shape, n)
            for i in range(n):
                per[i][name] = rows[i]
    return per


def expected(v1):
    """What docs/api.md's mapping makes of one /v1 output object."""
    e = {}
    if "output_tokens" in v1:
        e["OUTPUT_TOKENS"] = v1["output_tokens"]
    elif "nodes" in v1:
        e["LOGITS"] = [n["logits"] for n in v1["nodes"]]
        if all("label_name" in n for n in v1["nodes"]):
            e["LABEL"] = [n["label_name"] for n in v1["nodes"]]
    elif "tags" in v1:
        e["LOGITS"] = v1["logits"]
        if "tag_names" in v1:
            e["LABEL"] = v1["tag_names"]
        if "path_score" in v1:
            e["PATH_SCORE"] = v1["path_score"]
    else:
        e["LOGITS"] = v1["logits"]
        if "label_name" in v1:
            e["LABEL"] = v1["label_name"]
    if "h" in v1:
        e["HIDDEN"] = v1["h"]
    return e


class KServe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="canopy-kserve-")
        models = os.path.join(cls.tmp, "models")
        lex = os.path.join(cls.tmp, "lexicon.txt")
        with open(os.path.join(DATA, "lexicon.txt")) as f, \
                open(lex, "w") as g:
            g.writelines(next(f) for _ in range(3000))
        cls.inputs = {}
        for name, (fam, data, extra, _) in MODELS.items():
            extra = ["--lexicon", lex] if extra == ["--lexicon"] else extra
            cls.init(fam, os.path.join(models, name), data, 8, 8, extra)
            cls.inputs[name] = head(os.path.join(DATA, data), N)
        for name, (fam, data, desc) in CELL_MODELS.items():
            d = os.path.join(models, name)
            cls.init(fam, d, data, 16, 12, [])
            as_cells_model(d, desc)
            cls.inputs[name] = head(os.path.join(DATA, data), N)
        cls.port = free_port()
        env = dict(os.environ,
                   CANOPY_POLICY_CACHE=os.path.join(cls.tmp, "policies"))
        cls.log = open(os.path.join(cls.tmp, "serve.log"), "w")
        cls.daemon = subprocess.Popen(
            [BIN, "serve", "--models-dir", models, "--port", str(cls.port),
             "--workers", "2", "--max-delay-us", str(MAX_DELAY_US),
             "--max-instances-per-request", str(MAX_PER_REQUEST)],
            stderr=cls.log, env=env)
        cls.c = Client(cls.port)
        for _ in range(3000):  # 60 s: ten models to warm up under ASan
            try:
                if cls.c.call("GET", "/v2/health/ready")[0] == 200:
                    return
            except OSError:
                pass
            if cls.daemon.poll() is not None:
                break
            time.sleep(0.02)
        cls.tearDownClass()
        raise RuntimeError("canopy serve was not ready within 60 s")

    @classmethod
    def init(cls, fam, d, data, hidden, embed, extra):
        subprocess.run([BIN, "model", "init", fam, d, "--hidden", str(hidden),
                        "--embed", str(embed), "--vocab-from",
                        os.path.join(DATA, data), "--seed", "5"] + extra,
                       check=True, capture_output=True)

    @classmethod
    def tearDownClass(cls):
        """SIGTERM; the daemon must drain and exit 0 (under ASan a leak or
        an error exits otherwise, and fails the test)."""
        if cls.daemon.poll() is None:
            cls.daemon.terminate()
            cls.daemon.wait(timeout=60)
        cls.log.close()
        with open(os.path.join(cls.tmp, "serve.log")) as f:
            log = f.read()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if cls.daemon.returncode != 0:
            raise AssertionError("canopy serve exited %d; its log ends:\n%s"
                                 % (cls.daemon.returncode, log[-4000:]))

    def v1(self, model, instances, options):
        body = dict(options, instances=instances)
        st, r = self.c.call("POST", "/v1/models/%s/infer" % model, body)
        self.assertEqual(st, 200, r)
        return r

    def meta(self, model):
        st, m = self.c.call("GET", "/v2/models/" + model)
        self.assertEqual(st, 200, m)
        return m

    def assert_error(self, st_body, status, *words):
        st, body = st_body
        self.assertEqual(st, status, body)
        self.assertEqual(list(body), ["error"], body)
        self.assertIsInstance(body["error"], str)
        for w in words:
            self.assertIn(w, body["error"])

    # ---- metadata ------------------------------------------------------

    def test_server_metadata(self):
        st, m = self.c.call("GET", "/v2")
        self.assertEqual(st, 200)
        self.assertEqual(m["name"], "canopy")
        self.assertIsInstance(m["version"], str)
        self.assertIn("model_repository", m["extensions"])
        self.assertIn("binary_tensor_data", m["extensions"])
        self.assertIn("classification", m["extensions"])

    def test_model_metadata(self):
        want = {
            "treelstm": ["LOGITS", "LABEL", "HIDDEN", "OFFSETS"],
            "mvrnn": ["LOGITS", "LABEL", "HIDDEN", "OFFSETS"],
            "tagger": ["LOGITS", "LABEL", "HIDDEN", "OFFSETS"],
            "crf": ["LOGITS", "LABEL", "PATH_SCORE", "HIDDEN", "OFFSETS"],
            "latticelstm": ["LOGITS", "LABEL", "HIDDEN", "OFFSETS"],
            "latticegru": ["LOGITS", "LABEL", "HIDDEN"],
            "nmt": ["OUTPUT_TOKENS", "HIDDEN", "OFFSETS"],
            "cells-bilstm": ["LOGITS", "LABEL", "HIDDEN", "OFFSETS"],
        }
        for model, names in want.items():
            m = self.meta(model)
            info = self.c.call("GET", "/v1/models/" + model)[1]
            self.assertEqual(m["name"], model)
            self.assertEqual(m["versions"], [info["version"]])
            self.assertEqual(m["platform"], "canopy_" + info["family"])
            self.assertEqual(m["inputs"], [{"name": "INSTANCE",
                                            "datatype": "BYTES",
                                            "shape": [-1]}])
            self.assertEqual([o["name"] for o in m["outputs"]], names, model)
            for o in m["outputs"]:
                if o["name"] == "LOGITS":
                    self.assertEqual(o["shape"], [-1, info["classes"]])
                    self.assertEqual(o["datatype"], "FP32")
                elif o["name"] == "OFFSETS":
                    self.assertEqual(o["datatype"], "INT64")
            # the version in the path: the one serving, or 404
            st, mv = self.c.call("GET", "/v2/models/%s/versions/%s"
                                 % (model, info["version"]))
            self.assertEqual((st, mv), (200, m))
            self.assert_error(self.c.call(
                "GET", "/v2/models/%s/versions/0000" % model), 404,
                "no version '0000'", info["version"])

    def test_metadata_widths_are_the_answers(self):
        """HIDDEN's and LOGITS' widths in the metadata are those the
        answers have, for every model (bilstm and bisequence cells read
        both ways: twice "hidden")."""
        for model in list(MODELS) + list(CELL_MODELS):
            widths = {o["name"]: o["shape"][1:]
                      for o in self.meta(model)["outputs"]}
            st, r = self.c.infer(model, self.inputs[model][:2],
                                 dict(MODELS.get(model, (0, 0, 0, {}))[3],
                                      return_hidden=True))
            self.assertEqual(st, 200, r)
            for t in r["outputs"]:
                self.assertEqual(t["shape"][1:], widths[t["name"]],
                                 (model, t["name"]))

    # ---- inference against /v1 -----------------------------------------

    def check_family(self, model, options):
        insts = self.inputs[model]
        ref = self.v1(model, insts, options)
        st, r = self.c.infer(model, insts, options, request_id="req-" + model)
        self.assertEqual(st, 200, r)
        self.assertEqual(r["id"], "req-" + model)
        self.assertEqual(r["model_name"], model)
        self.assertEqual(r["model_version"], ref["model_version"])
        m = self.meta(model)
        per = split(r, len(insts), per_row_names(
            m["parameters"]["family"], m["parameters"]["input"], options))
        for i, (got, v1) in enumerate(zip(per, ref["outputs"])):
            self.assertEqual(got, expected(v1), "%s instance %d" % (model, i))
        for t in r["outputs"]:
            self.assertEqual(t["datatype"],
                             {"LOGITS": "FP32", "HIDDEN": "FP32",
                              "PATH_SCORE": "FP32", "LABEL": "BYTES",
                              "OUTPUT_TOKENS": "BYTES",
                              "OFFSETS": "INT64"}[t["name"]])
        return r

    def test_every_family_equals_v1(self):
        for model, (_, _, _, options) in MODELS.items():
            for hidden in (False, True):
                with self.subTest(model=model, hidden=hidden):
                    opts = dict(options, return_hidden=hidden)
                    r = self.check_family(model, opts)
                    names = [t["name"] for t in r["outputs"]]
                    self.assertEqual("HIDDEN" in names, hidden)
        for model in CELL_MODELS:
            with self.subTest(model=model):
                self.check_family(model, {"return_hidden": True})

    def test_tree_root_and_all(self):
        """outputs "root": LOGITS [N, C], no OFFSETS; "all": every node in
        pre-order, LOGITS [total, C] with OFFSETS [N + 1]."""
        insts = self.inputs["treelstm"]
        st, r = self.c.infer("treelstm", insts)
        shapes = {t["name"]: t["shape"] for t in r["outputs"]}
        self.assertEqual(shapes, {"LOGITS": [N, 5], "LABEL": [N]})
        st, r = self.c.infer("treelstm", insts, {"outputs": "all"})
        t = {t["name"]: t for t in r["outputs"]}
        ref = self.v1("treelstm", insts, {"outputs": "all"})["outputs"]
        nodes = [len(o["nodes"]) for o in ref]
        offs = [0]
        for k in nodes:
            offs.append(offs[-1] + k)
        self.assertEqual(t["OFFSETS"]["data"], offs)
        self.assertEqual(t["OFFSETS"]["shape"], [N + 1])
        self.assertEqual(t["LOGITS"]["shape"], [offs[-1], 5])
        self.assertEqual(t["LABEL"]["shape"], [offs[-1]])
        self.check_family("treelstm", {"outputs": "all",
                                       "return_hidden": True})

    def test_tagger_rows_and_offsets(self):
        insts = self.inputs["tagger"]
        st, r = self.c.infer("tagger", insts)
        t = {t["name"]: t for t in r["outputs"]}
        lens = [len(i["tokens"]) for i in insts]
        self.assertEqual(t["OFFSETS"]["data"],
                         [sum(lens[:k]) for k in range(N + 1)])
        self.assertEqual(t["LOGITS"]["shape"], [sum(lens), 5])
        self.assertEqual(t["LABEL"]["shape"], [sum(lens)])

    def test_decoder_tokens(self):
        insts = self.inputs["nmt"]
        opts = {"max_decode_len": 8, "return_hidden": True}
        st, r = self.c.infer("nmt", insts, opts)
        t = {t["name"]: t for t in r["outputs"]}
        ref = self.v1("nmt", insts, opts)["outputs"]
        flat = [tok for o in ref for tok in o["output_tokens"]]
        self.assertEqual(t["OUTPUT_TOKENS"]["data"], flat)
        self.assertEqual(t["OUTPUT_TOKENS"]["shape"], [len(flat)])
        self.assertEqual(t["HIDDEN"]["shape"], [N, 8])
        self.assertEqual(t["OFFSETS"]["data"][-1], len(flat))

    def test_version_in_the_path(self):
        v = self.meta("tagger")["versions"][0]
        insts = self.inputs["tagger"][:2]
        st, r = self.c.infer("tagger", insts, version=v)
        self.assertEqual(st, 200, r)
        self.assertEqual(r["model_version"], v)
        self.assertEqual(r["outputs"], self.c.infer("tagger", insts)[1]
                         ["outputs"])
        self.assert_error(self.c.infer("tagger", insts, version="v9"), 404,
                          "no version 'v9'", v)
        st, b = self.c.call("GET", "/v2/models/tagger/versions/%s/ready" % v)
        self.assertEqual((st, b["ready"]), (200, True))
        self.assertEqual(self.c.call(
            "GET", "/v2/models/tagger/versions/v9/ready")[0], 404)
        self.assertEqual(self.c.call("GET", "/v2/models/tagger/ready")[0],
                         200)

    def test_asked_for_outputs(self):
        insts = self.inputs["tagger"]
        st, r = self.c.infer("tagger", insts, outputs=["LABEL"])
        self.assertEqual(st, 200, r)
        self.assertEqual([t["name"] for t in r["outputs"]],
                         ["LABEL", "OFFSETS"])
        # HIDDEN asked for is return_hidden
        st, r = self.c.infer("treelstm", self.inputs["treelstm"],
                             outputs=["HIDDEN"])
        self.assertEqual(st, 200, r)
        self.assertEqual([t["name"] for t in r["outputs"]], ["HIDDEN"])
        self.assertEqual(r["outputs"][0]["shape"], [N, 8])
        self.assert_error(self.c.infer("treelstm", self.inputs["treelstm"],
                                       outputs=["OUTPUT_TOKENS"]), 400,
                          "unknown output 'OUTPUT_TOKENS'", "LOGITS")

    def test_concurrent_v1_and_v2_alike(self):
        """v2 and /v1 requests batched together: every answer the same."""
        insts = self.inputs["crf"]
        ref = [self.v1("crf", [i], {})["outputs"][0] for i in insts]
        bad = []

        def client(k):
            for j in range(6):
                i = (k + j) % N
                if (k + j) % 2:
                    got = self.v1("crf", [insts[i]], {})["outputs"][0]
                    ok = got == ref[i]
                else:
                    st, r = self.c.infer("crf", [insts[i]])
                    rows = {"LOGITS", "LABEL", "HIDDEN"}
                    ok = st == 200 and split(r, 1, rows)[0] == \
                        expected(ref[i])
                if not ok:
                    bad.append((k, j))
        ts = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(bad, [])

    def test_metrics_count_v2(self):
        def count():
            st, _ = self.c.call("GET", "/v2")
            c = http.client.HTTPConnection("127.0.0.1", self.port)
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
            c.close()
            for line in text.splitlines():
                if line.startswith('canopy_requests_total{model="latticegru",'
                                   'status="200"}'):
                    return int(float(line.split()[-1]))
            return 0
        before = count()
        st, r = self.c.infer("latticegru", self.inputs["latticegru"][:1])
        self.assertEqual(st, 200, r)
        self.assertEqual(count(), before + 1)

    # ---- binary tensor data (Triton's extension) -----------------------

    def check_binary_family(self, model, options, shape2=False,
                            json_input=False):
        """tritonclient's defaults: INSTANCE as binary data (or JSON),
        no outputs named and binary_data_output true: every output comes
        back as binary data, the numbers the float32s of /v1's."""
        insts = self.inputs[model]
        ref = self.v1(model, insts, options)
        params = dict(options, binary_data_output=True)
        shape = [len(insts), 1] if shape2 else None
        if json_input:
            body = {"inputs": [{"name": "INSTANCE", "datatype": "BYTES",
                                "shape": shape or [len(insts)],
                                "data": [json.dumps(i) for i in insts]}],
                    "parameters": params}
            st, rh, r = self.c.send_v2(model, json.dumps(body).encode())
        else:
            st, rh, r = self.c.infer_binary(model, insts, shape=shape,
                                            parameters=params)
        self.assertEqual(st, 200, r)
        self.assertEqual(rh["content-type"], "application/octet-stream")
        self.assertIn("inference-header-content-length", rh)
        self.assertTrue(all(t.get("binary") for t in r["outputs"]), r)
        m = self.meta(model)
        per = split(r, len(insts), per_row_names(
            m["parameters"]["family"], m["parameters"]["input"], options))
        for i, (got, v1) in enumerate(zip(per, ref["outputs"])):
            want = {k: as_f32(v) if k in ("LOGITS", "HIDDEN", "PATH_SCORE")
                    else v for k, v in expected(v1).items()}
            self.assertEqual(got, want, "%s instance %d" % (model, i))
        return r

    def test_binary_every_family_equals_v1(self):
        for model, (_, _, _, options) in MODELS.items():
            for shape2, json_input in ((False, False), (True, False),
                                       (False, True)):
                with self.subTest(model=model, shape2=shape2,
                                  json_input=json_input):
                    self.check_binary_family(
                        model, dict(options, return_hidden=True), shape2,
                        json_input)
        for model in CELL_MODELS:
            with self.subTest(model=model):
                self.check_binary_family(model, {"return_hidden": True})

    def test_binary_request_json_answer(self):
        """Binary in, JSON out: the very answer of the JSON request."""
        for model in ("treelstm", "tagger", "nmt", "latticelstm"):
            opts = dict(MODELS[model][3], return_hidden=True)
            insts = self.inputs[model]
            st, rh, r = self.c.infer_binary(model, insts, parameters=opts)
            self.assertEqual(st, 200, r)
            self.assertEqual(rh["content-type"], "application/json")
            self.assertNotIn("inference-header-content-length", rh)
            self.assertEqual(r["outputs"],
                             self.c.infer(model, insts, opts)[1]["outputs"])

    def test_binary_some_outputs(self):
        """binary_data per output, overriding binary_data_output; the
        binary parts follow the outputs' order."""
        insts = self.inputs["crf"]
        ref = self.c.infer("crf", insts)[1]
        want = {t["name"]: t for t in ref["outputs"]}
        outs = [{"name": "PATH_SCORE", "parameters": {"binary_data": True}},
                {"name": "LABEL", "parameters": {"binary_data": False}},
                {"name": "LOGITS"},
                {"name": "OFFSETS", "parameters": {"binary_data": True}}]
        for all_bin in (False, True):
            st, rh, r = self.c.infer_binary(
                "crf", insts, outputs=outs,
                parameters={"binary_data_output": all_bin})
            self.assertEqual(st, 200, r)
            got = {t["name"]: t for t in r["outputs"]}
            self.assertEqual(set(got), {"PATH_SCORE", "LABEL", "LOGITS",
                                        "OFFSETS"})
            binary = {n for n, t in got.items() if t.get("binary")}
            self.assertEqual(binary, {"PATH_SCORE", "OFFSETS"} |
                             ({"LOGITS"} if all_bin else set()))
            for n, t in got.items():
                self.assertEqual(t["shape"], want[n]["shape"], n)
                self.assertEqual(t["datatype"], want[n]["datatype"], n)
                self.assertEqual(t["data"], as_f32(want[n]["data"])
                                 if n in binary and t["datatype"] == "FP32"
                                 else want[n]["data"], n)

    def test_binary_data_output_covers_offsets(self):
        """binary_data_output is every output's default, OFFSETS (answered
        beside per-token outputs without being named) too."""
        insts = self.inputs["tagger"]
        ref = {t["name"]: t for t in self.c.infer("tagger", insts)[1]
               ["outputs"]}
        st, rh, r = self.c.infer_binary(
            "tagger", insts, outputs=[{"name": "LABEL"}],
            parameters={"binary_data_output": True})
        self.assertEqual(st, 200, r)
        self.assertEqual([(t["name"], t.get("binary"), t["data"])
                          for t in r["outputs"]],
                         [("LABEL", True, ref["LABEL"]["data"]),
                          ("OFFSETS", True, ref["OFFSETS"]["data"])])

    def test_shape_n_1(self):
        """INSTANCE [N, 1], its data flat or nested, is INSTANCE [N]."""
        insts = self.inputs["tagger"]
        want = self.c.infer("tagger", insts)[1]["outputs"]
        for data in ([json.dumps(i) for i in insts],
                     [[json.dumps(i)] for i in insts]):
            body = {"inputs": [{"name": "INSTANCE", "datatype": "BYTES",
                                "shape": [len(insts), 1], "data": data}]}
            st, r = self.post(body, model="tagger")
            self.assertEqual(st, 200, r)
            self.assertEqual(r["outputs"], want)
        st, rh, r = self.c.infer_binary("tagger", insts,
                                        shape=[len(insts), 1])
        self.assertEqual((st, r["outputs"]), (200, want))

    # ---- classification (Triton's extension) ---------------------------

    def check_classes(self, t, rows, k, labels):
        """t: a classified tensor; rows: the score rows it came from (from
        /v1); labels: the class names, or None ("value:index")."""
        width = len(rows[0]) if rows else 0
        kk = min(k, width)
        self.assertEqual(t["datatype"], "BYTES")
        self.assertEqual(t["shape"], [len(rows), kk])
        self.assertEqual(len(t["data"]), len(rows) * kk)
        for r, row in enumerate(rows):
            order = sorted(range(width), key=lambda i: (-row[i], i))[:kk]
            for j, idx in enumerate(order):
                parts = t["data"][r * kk + j].split(":", 2)
                self.assertEqual(len(parts), 3 if labels else 2, parts)
                self.assertEqual(int(parts[1]), idx, (r, j, row))
                self.assertEqual(float(parts[0]), row[idx])
                if labels:
                    self.assertEqual(parts[2], labels[idx])

    def test_classification(self):
        for model in list(MODELS) + list(CELL_MODELS):
            if model == "nmt":
                continue
            opts = dict(MODELS.get(model, (0, 0, 0, {}))[3])
            insts = self.inputs[model]
            ref = self.v1(model, insts, dict(opts, return_hidden=True))
            labels = self.c.call("GET", "/v1/models/" + model)[1]["labels"]
            per_inst = [expected(o) for o in ref["outputs"]]
            per_row = model in ("childsum", "tagger", "crf", "latticelstm",
                                "cells-bilstm")
            rows = {}
            for name in ("LOGITS", "HIDDEN"):
                rows[name] = ([x for e in per_inst for x in e[name]]
                              if per_row and (name == "LOGITS" or
                                              model != "childsum")
                              else [e[name] for e in per_inst])
            for k, binary in ((2, False), (3, True), (1000, False)):
                with self.subTest(model=model, k=k, binary=binary):
                    outs = [{"name": "LOGITS",
                             "parameters": {"classification": k,
                                            "binary_data": binary}},
                            {"name": "HIDDEN",
                             "parameters": {"classification": k}},
                            {"name": "LABEL"}]
                    st, rh, r = self.c.infer_binary(model, insts,
                                                    parameters=opts,
                                                    outputs=outs)
                    self.assertEqual(st, 200, r)
                    got = {t["name"]: t for t in r["outputs"]}
                    self.assertEqual(bool(got["LOGITS"].get("binary")),
                                     binary)
                    self.check_classes(got["LOGITS"], rows["LOGITS"], k,
                                       labels)
                    self.check_classes(got["HIDDEN"], rows["HIDDEN"], k,
                                       None)
        # nmt: its HIDDEN, the decoder's last state, one row an instance
        insts = self.inputs["nmt"]
        ref = self.v1("nmt", insts, {"max_decode_len": 8,
                                     "return_hidden": True})
        st, rh, r = self.c.infer_binary(
            "nmt", insts, parameters={"max_decode_len": 8},
            outputs=[{"name": "HIDDEN", "parameters": {"classification": 4}}])
        self.assertEqual(st, 200, r)
        self.check_classes(r["outputs"][0], [o["h"] for o in ref["outputs"]],
                           4, None)

    # ---- compression -----------------------------------------------------

    def test_compressed_bodies_and_answers(self):
        insts = self.inputs["tagger"]
        plain = self.c.infer("tagger", insts)[1]["outputs"]
        body = json.dumps({"inputs": [{"name": "INSTANCE",
                                       "datatype": "BYTES",
                                       "shape": [len(insts)],
                                       "data": [json.dumps(i)
                                                for i in insts]}]}).encode()
        for enc in ("gzip", "deflate"):
            for accept in (None, "gzip", "deflate", "br",
                           "gzip;q=0.2, deflate;q=0.8"):
                with self.subTest(enc=enc, accept=accept):
                    st, rh, r = self.c.send_v2("tagger", body, compress=enc,
                                               accept=accept)
                    self.assertEqual(st, 200, r)
                    self.assertEqual(r["outputs"], plain)
                    want = {"gzip": "gzip", "deflate": "deflate",
                            "gzip;q=0.2, deflate;q=0.8": "deflate"}
                    self.assertEqual(rh.get("content-encoding"),
                                     want.get(accept))
            # binary both ways, compressed both ways (tritonclient's
            # request_compression_algorithm)
            st, rh, r = self.c.infer_binary(
                "tagger", insts, parameters={"binary_data_output": True},
                compress=enc, accept=enc)
            self.assertEqual((st, rh["content-encoding"]), (200, enc))
            self.assertEqual([t["data"] for t in r["outputs"]],
                             [as_f32(t["data"]) if t["datatype"] == "FP32"
                              else t["data"] for t in plain])
        # a raw deflate stream, which some clients send as "deflate"
        co = zlib.compressobj(6, zlib.DEFLATED, -15)
        raw = co.compress(body) + co.flush()
        st, rh, r = self.c.raw("POST", "/v2/models/tagger/infer", raw,
                               {"Content-Encoding": "deflate"})
        self.assertEqual((st, json.loads(r)["outputs"]), (200, plain))
        # /v1 too
        v1 = json.dumps({"instances": insts}).encode()
        ref = self.v1("tagger", insts, {})["outputs"]
        st, rh, raw = self.c.raw("POST", "/v1/models/tagger/infer",
                                 gzip.compress(v1),
                                 {"Content-Encoding": "gzip",
                                  "Accept-Encoding": "gzip"})
        self.assertEqual(st, 200, raw)
        self.assertEqual(rh["content-encoding"], "gzip")
        self.assertEqual(rh["vary"], "Accept-Encoding")
        self.assertEqual(json.loads(gzip.decompress(raw))["outputs"], ref)

    def test_compression_errors(self):
        body = json.dumps(self.body()).encode()
        z = gzip.compress(body)
        cases = [
            ({"Content-Encoding": "br"}, body, 415, "Content-Encoding"),
            ({"Content-Encoding": "gzip, deflate"}, body, 415, "one coding"),
            ({"Content-Encoding": "gzip"}, body, 400, "not valid gzip"),
            ({"Content-Encoding": "gzip"}, z[:-6], 400, "ends before"),
            ({"Content-Encoding": "deflate"}, zlib.compress(body) + b"x",
             400, "after its compressed stream"),
        ]
        for headers, b, status, words in cases:
            with self.subTest(headers=headers, status=status):
                h = dict(headers, **{"Accept-Encoding": "gzip"})
                st, rh, raw = self.c.raw("POST", "/v2/models/treelstm/infer",
                                         b, h)
                self.assertNotIn("content-encoding", rh)  # errors: plain
                self.assert_error((st, json.loads(raw)), status, words)
                st, rh, raw = self.c.raw("POST", "/v1/models/treelstm/infer",
                                         b, h)
                self.assertEqual(st, status)
                self.assertEqual(json.loads(raw)["error"]["code"],
                                 {415: "unsupported_encoding",
                                  400: "bad_request"}[status])

    def test_zip_bomb_413(self):
        """64 MiB of spaces in a ~64 KiB gzip body: over max-body-bytes (8
        MiB) once inflated, 413 on both APIs. With its compressed tail
        replaced by junk it is still 413, not 400: the daemon stopped at
        the bound and never read that far."""
        head = json.dumps(self.body()).encode()[:-1]
        co = zlib.compressobj(9, zlib.DEFLATED, 16 + 15)
        z = co.compress(head)
        chunk = b" " * (1 << 20)
        for _ in range(64):
            z += co.compress(chunk)
        z += co.compress(b"}") + co.flush()
        self.assertLess(len(z), 1 << 20)
        junk = z[:len(z) // 2] + b"\xff" * (len(z) - len(z) // 2)
        for bomb in (z, junk):
            for path in ("/v2/models/treelstm/infer",
                         "/v1/models/treelstm/infer"):
                st, rh, raw = self.c.raw("POST", path, bomb,
                                         {"Content-Encoding": "gzip"})
                self.assertEqual(st, 413, raw[:300])
                err = json.loads(raw)["error"]
                msg = err if isinstance(err, str) else err["message"]
                self.assertIn("inflates (gzip) to more than 8388608 bytes "
                              "(max-body-bytes", msg)
        self.assertEqual(self.c.call("GET", "/v2/health/ready")[0], 200)

    # ---- errors --------------------------------------------------------

    def body(self, **tensor):
        t = {"name": "INSTANCE", "datatype": "BYTES", "shape": [1],
             "data": [json.dumps(self.inputs["treelstm"][0])]}
        t.update(tensor)
        return {"inputs": [t]}

    def post(self, body, model="treelstm"):
        return self.c.call("POST", "/v2/models/%s/infer" % model, body)

    def test_errors(self):
        self.assert_error(self.post(self.body(name="TEXT")), 400,
                          "unknown input 'TEXT'", "INSTANCE")
        self.assert_error(self.post(self.body(datatype="FP32")), 400,
                          "datatype FP32", "BYTES")
        self.assert_error(self.post(b'{"inputs": [{"name": "INSTANCE"'),
                          400, "not valid JSON")
        self.assert_error(self.post(self.body(), model="no-such"), 404,
                          "no-such")
        self.assert_error(self.post(self.body(shape=[2])), 400,
                          "shape [2]", "1 elements")
        self.assert_error(self.post(self.body(shape=[1, 2])), 400,
                          "shape must be [N] or [N, 1]")
        self.assert_error(self.post(self.body(shape=[1, 1, 1])), 400,
                          "shape must be [N] or [N, 1]")
        self.assert_error(self.post(self.body(shape=[2, 1])), 400,
                          "shape [2, 1]", "1 elements")
        self.assert_error(self.post(self.body(data=[7])), 400,
                          "INSTANCE[0] is not a string")
        self.assert_error(self.post(self.body(data=["{\"tree\": "])), 400,
                          "INSTANCE[0] is not valid JSON")
        self.assert_error(self.post(self.body(data=["\"(a b)\""])), 400,
                          "INSTANCE[0] must hold a JSON object")
        self.assert_error(self.post({"inputs": []}), 400, "INSTANCE")
        self.assert_error(self.post(self.body(shape=[0], data=[])), 400,
                          "empty")
        self.assert_error(self.post({"id": 3, **self.body()}), 400, "\"id\"")
        two = self.body(shape=[2], data=[json.dumps({"tree": "(a b)"}),
                                         json.dumps({"tree": "(a b"})])
        self.assert_error(self.post(two), 400, "INSTANCE[1]:")
        self.assert_error(self.post({"inputs": [
            {"name": "INSTANCE", "datatype": "BYTES", "shape": [1],
             "data": [json.dumps({"tokens": ["a"]})]}]}), 400,
            "INSTANCE[0]:", "tree")
        # /v1's option checks, on the parameters that carry them
        self.assert_error(self.post(dict(self.body(),
                                         parameters={"timeout_ms": 0})),
                          400, "timeout_ms")
        self.assert_error(self.post(dict(self.body(),
                                         parameters={"outputs": "some"})),
                          400, "outputs")
        self.assert_error(self.post(dict(
            self.body(), parameters={"binary_data_output": 1})),
            400, "binary_data_output must be true or false")
        out = lambda **p: dict(self.body(), outputs=[
            {"name": "LOGITS", "parameters": p}])
        self.assert_error(self.post(out(binary_data="yes")), 400,
                          "output LOGITS parameters.binary_data must be true "
                          "or false")
        self.assert_error(self.post(out(classification=-1)), 400,
                          "parameters.classification must be an integer")
        self.assert_error(self.post(out(classification="2")), 400,
                          "parameters.classification must be an integer")
        self.assert_error(self.post(dict(self.body(), outputs=[
            {"name": "LABEL", "parameters": {"classification": 2}}])), 400,
            "classification applies to LOGITS and HIDDEN")
        self.assert_error(self.post(dict(self.body(), outputs=[
            {"name": "LOGITS"}, {"name": "LOGITS"}])), 400, "twice")
        # a parameter of the wrong type is 400 whatever else is asked:
        # return_hidden "yes" once became true when HIDDEN was among the
        # outputs (200) and was refused only without it
        for outputs in (None, [{"name": "HIDDEN"}],
                        [{"name": "LOGITS"}, {"name": "HIDDEN"}],
                        [{"name": "LOGITS"}]):
            for val in ("yes", 1, "true", None, [True]):
                b = dict(self.body(), parameters={"return_hidden": val})
                if outputs is not None:
                    b["outputs"] = outputs
                self.assert_error(self.post(b), 400,
                                  "\"return_hidden\" must be a boolean")
        for key, val in (("outputs", 1), ("timeout_ms", "9"),
                         ("max_decode_len", True)):
            for outputs in (None, [{"name": "HIDDEN"}]):
                b = dict(self.body(), parameters={key: val})
                if outputs is not None:
                    b["outputs"] = outputs
                self.assert_error(self.post(b), 400, "\"%s\"" % key)
        st, _ = self.c.call("GET", "/v2/models/treelstm/infer")
        self.assertEqual(st, 405)

    def test_binary_malformed(self):
        """Every way binary data can be wrong is 400 naming it."""
        inst = json.dumps(self.inputs["treelstm"][0]).encode()
        good = pack_elements([inst])

        def send(els, size=None, shape=None, hlen_delta=0, hlen=None,
                 tensor=None, trailer=b""):
            t = {"name": "INSTANCE", "datatype": "BYTES",
                 "shape": shape or [1],
                 "parameters": {"binary_data_size":
                                len(els) if size is None else size}}
            t.update(tensor or {})
            h = json.dumps({"inputs": [t]}).encode()
            st, rh, r = self.c.send_v2(
                "treelstm", h + els + trailer,
                hlen if hlen is not None else len(h) + hlen_delta)
            return st, r

        self.assertEqual(send(good)[0], 200)
        cases = [
            (dict(els=good, hlen=len(good) + 10 ** 6), "Inference-Header-"
             "Content-Length is 1"),
            (dict(els=good, hlen="abc"), "must be a byte count"),
            (dict(els=good, hlen="-5"), "must be a byte count"),
            (dict(els=good, hlen_delta=-3), "JSON header"),
            (dict(els=good, size=-1), "binary_data_size must be an integer "
             ">= 0"),
            (dict(els=good, size="12"), "binary_data_size must be an "
             "integer >= 0"),
            (dict(els=good, size=len(good) + 1), "runs past the body's end"),
            (dict(els=struct.pack("<I", len(inst) + 1) + inst),
             "INSTANCE[0]'s 4-byte length says %d bytes but %d remain"
             % (len(inst) + 1, len(inst))),
            (dict(els=struct.pack("<I", 0xffffffff) + inst),
             "4-byte length says 4294967295 bytes"),
            (dict(els=good + b"\x01\x00", shape=[2]), "ends inside element "
             "1's 4-byte length"),
            (dict(els=good + pack_elements([inst]), shape=[1]),
             "bytes left over"),
            (dict(els=good, shape=[3]), "ends inside element 1's 4-byte "
             "length: it holds fewer than the 3 elements"),
            (dict(els=good, shape=[100]), "cannot hold that many"),
            (dict(els=good, shape=[-1]), "cannot hold that many"),
            (dict(els=good, trailer=b"xyz"), "the body has %d bytes after "
             "its JSON header (Inference-Header-Content-Length) but its "
             "inputs' binary_data_size add up to %d"
             % (len(good) + 3, len(good))),
            (dict(els=good, tensor={"data": ["{}"]}), "both \"data\" and "
             "parameters.binary_data_size"),
            (dict(els=pack_elements([b"{\"tree\": "])),
             "INSTANCE[0] is not valid JSON"),
            (dict(els=pack_elements([b"\xff\xfe"])),
             "INSTANCE[0] is not valid JSON"),
            (dict(els=pack_elements([inst, b"[1]"]), shape=[2]),
             "INSTANCE[1] must hold a JSON object"),
            (dict(els=b"", shape=[0]), "empty"),
        ]
        for kw, words in cases:
            with self.subTest(words=words):
                self.assert_error(send(**kw), 400, words)
        # a zero-length JSON header
        st, rh, r = self.c.send_v2("treelstm", good, 0)
        self.assert_error((st, r), 400, "JSON header")

    def test_limits_as_v1(self):
        many = 1025  # over max-instances-per-request (1,024)
        body = self.body(shape=[many],
                         data=[json.dumps({"tree": "(a b)"})] * many)
        self.assert_error(self.post(body), 413, "max-instances-per-request")
        # a tree deeper than max-depth (512), as /v1 refuses it
        # the same in binary, and compressed: counted alike
        els = [json.dumps({"tree": "(a b)"}).encode()] * many
        st, rh, r = self.c.infer_binary("treelstm", [{"tree": "(a b)"}] *
                                        many, compress="gzip")
        self.assert_error((st, r), 413, "max-instances-per-request")
        self.assertEqual(len(els), many)
        deep = "(a " * 600 + "b" + ")" * 600
        st, v1 = self.c.call("POST", "/v1/models/treelstm/infer",
                             {"tree": deep})
        self.assertEqual(st, 413)
        self.assert_error(self.post(self.body(
            data=[json.dumps({"tree": deep})])), 413, "max-depth")

    # ---- health, errors and metadata as the protocol spells them -------

    def test_health_bodies(self):
        """The Open Inference Protocol's REST text: server live
        {"live": $bool}, server ready {"ready": $bool}, model ready
        {"name": $string, "ready": $bool}."""
        self.assertEqual(self.c.call("GET", "/v2/health/live"),
                         (200, {"live": True}))
        self.assertEqual(self.c.call("GET", "/v2/health/ready"),
                         (200, {"ready": True}))
        for path in ("/v2/models/tagger/ready", "/v2/models/tagger/versions/"
                     "%s/ready" % self.meta("tagger")["versions"][0]):
            st, b = self.c.call("GET", path)
            self.assertEqual(st, 200, b)
            self.assertEqual((b["name"], b["ready"]), ("tagger", True))
        # /healthz and /readyz are the daemon's own, unchanged
        self.assertEqual(self.c.call("GET", "/healthz"),
                         (200, {"status": "ok"}))

    def test_server_metadata_with_a_slash(self):
        """The protocol's text says GET v2, its yaml /v2/: both are the
        server metadata, with the extensions it answers."""
        st, a = self.c.call("GET", "/v2")
        self.assertEqual(self.c.call("GET", "/v2/"), (st, a))
        self.assertEqual(sorted(a), ["extensions", "name", "version"])
        for ext in ("model_repository", "model_configuration", "statistics"):
            self.assertIn(ext, a["extensions"])

    def test_every_v2_error_is_a_string(self):
        """Every error under /v2, whatever the route or the status, is
        {"error": $string} (the protocol's error objects); /v1 keeps its
        {"error": {"code", "message"}}."""
        cases = [
            ("GET", "/v2/nothing", 404, "no such route"),
            ("GET", "/v2/models/tagger/nothing", 404, "no such route"),
            ("GET", "/v2/health", 404, "no such route"),
            ("POST", "/v2/health/live", 405, "GET"),
            ("POST", "/v2/health/ready", 405, "GET"),
            ("POST", "/v2", 405, "GET"),
            ("GET", "/v2/models/tagger/infer", 405, "POST"),
            ("POST", "/v2/models/tagger/config", 405, "GET"),
            ("GET", "/v2/models/no-such/ready", 404, "no-such"),
            ("GET", "/v2/models/tagger/versions/v9/ready", 404, "v9"),
            ("GET", "/v2/models/no-such", 404, "no-such"),
            ("GET", "/v2/models/no-such/config", 404, "no-such"),
            ("GET", "/v2/models/tagger/versions/v9/config", 404, "v9"),
            ("GET", "/v2/models/no-such/stats", 404, "no-such"),
            ("GET", "/v2/models/tagger/versions/v9/stats", 404, "v9"),
            ("GET", "/v2/repository/index", 405, "POST"),
            # model-control none: the repository's load and unload refuse
            ("POST", "/v2/repository/models/tagger/load", 403,
             "model-control"),
            ("POST", "/v2/repository/models/tagger/unload", 403,
             "model-control"),
        ]
        for method, path, status, word in cases:
            with self.subTest(path=path, method=method):
                self.assert_error(self.c.call(method, path), status, word)
        st, b = self.c.call("GET", "/v1/models/no-such")
        self.assertEqual(st, 404)
        self.assertEqual(sorted(b["error"]), ["code", "message"])
        self.assertEqual(b["error"]["code"], "no_such_model")

    def test_did_you_mean(self):
        """A name that differs in case or by a typo is told the name
        served; a name near none is not."""
        self.assert_error(self.c.call("GET", "/v2/models/Tagger/ready"),
                          404, "no such model 'Tagger'",
                          "did you mean 'tagger'?")
        self.assert_error(self.post(self.body(), model="treelstn"), 404,
                          "did you mean 'treelstm'?")
        st, b = self.c.call("GET", "/v2/models/zzzzzzzz")
        self.assertEqual(st, 404)
        self.assertNotIn("did you mean", b["error"])

    def test_message_names_the_model_called(self):
        self.assert_error(self.post(self.body(data=[json.dumps(
            {"tokens": ["a"]})])), 400, "model 'treelstm' (treelstm) takes")
        st, b = self.c.call("POST", "/v1/models/crf/infer",
                            {"tree": "(a b)"})
        self.assertEqual(st, 400, b)
        self.assertIn("model 'crf' (bilstm-tagger) takes", b["error"]["message"])

    # ---- model configuration (Triton's extension) ----------------------

    def test_model_config(self):
        """Triton's model configuration: the metadata's tensors with
        model_config.proto's type names and one row's dims, the daemon's
        batching (max-instances-per-request, max-delay-us) as
        max_batch_size and dynamic_batching."""
        types = {"BYTES": "TYPE_STRING", "FP32": "TYPE_FP32",
                 "INT64": "TYPE_INT64"}
        for model in list(MODELS) + list(CELL_MODELS):
            with self.subTest(model=model):
                m = self.meta(model)
                st, cfg = self.c.call("GET", "/v2/models/%s/config" % model)
                self.assertEqual(st, 200, cfg)
                self.assertEqual(cfg["name"], model)
                self.assertEqual(cfg["platform"], m["platform"])
                self.assertEqual(cfg["backend"], "canopy")
                self.assertEqual(cfg["max_batch_size"], MAX_PER_REQUEST)
                self.assertEqual(cfg["dynamic_batching"]
                                 ["max_queue_delay_microseconds"],
                                 MAX_DELAY_US)
                self.assertEqual(cfg["version_policy"],
                                 {"latest": {"num_versions": 1}})
                self.assertEqual(len(cfg["input"]), 1)
                i = cfg["input"][0]
                self.assertEqual((i["name"], i["data_type"], i["dims"],
                                  i["reshape"]),
                                 ("INSTANCE", "TYPE_STRING", [1],
                                  {"shape": []}))
                # the outputs: the metadata's, less the rows' dimension
                self.assertEqual([o["name"] for o in cfg["output"]],
                                 [o["name"] for o in m["outputs"]])
                for o, t in zip(cfg["output"], m["outputs"]):
                    self.assertEqual(o["data_type"], types[t["datatype"]])
                    if len(t["shape"]) == 2:
                        self.assertEqual(o["dims"], t["shape"][1:])
                        self.assertNotIn("reshape", o)
                    else:
                        self.assertEqual((o["dims"], o["reshape"]),
                                         ([1], {"shape": []}))
                v = m["versions"][0]
                self.assertEqual(self.c.call(
                    "GET", "/v2/models/%s/versions/%s/config" % (model, v)),
                    (200, cfg))

    # ---- statistics (Triton's extension) -------------------------------

    def stats(self, path):
        st, b = self.c.call("GET", path)
        self.assertEqual(st, 200, b)
        self.assertEqual(list(b), ["model_stats"])
        return b["model_stats"]

    def test_stats_of_every_model(self):
        """GET /v2/models/stats is every model's statistics (not a model
        named "stats"), one entry per model and version serving."""
        all_ = self.stats("/v2/models/stats")
        served = self.c.call("GET", "/v1/models")[1]["models"]
        self.assertEqual(sorted((s["name"], s["version"]) for s in all_),
                         sorted((m["name"], m["version"]) for m in served))
        durations = ("success", "fail", "queue", "compute_input",
                     "compute_infer", "compute_output")
        for s in all_:
            for k in ("last_inference", "inference_count",
                      "execution_count"):
                self.assertIsInstance(s[k], int, (s["name"], k))
            for k in durations:
                d = s["inference_stats"][k]
                self.assertEqual(sorted(d), ["count", "ns"])
                self.assertGreaterEqual(d["count"], 0)
                self.assertGreaterEqual(d["ns"], 0)

    def test_stats_count_the_inferences(self):
        """One request of k instances: inference_count grows by k,
        success by one request, queue by one, execution_count by the runs
        (at least one); a failed one counts in fail; last_inference is
        the wall clock of the last answer (ms since the epoch)."""
        model = "latticegru"
        path = "/v2/models/%s/stats" % model
        (before,) = self.stats(path)
        self.assertEqual(before["name"], model)
        k = 3
        t0 = int(time.time() * 1000)
        st, r = self.c.infer(model, self.inputs[model][:k])
        self.assertEqual(st, 200, r)
        t1 = int(time.time() * 1000)
        (after,) = self.stats(path)
        b, a = before["inference_stats"], after["inference_stats"]
        self.assertEqual(after["inference_count"],
                         before["inference_count"] + k)
        self.assertEqual(a["success"]["count"], b["success"]["count"] + 1)
        self.assertGreater(a["success"]["ns"], b["success"]["ns"])
        self.assertEqual(a["queue"]["count"], b["queue"]["count"] + 1)
        self.assertGreaterEqual(after["execution_count"],
                                before["execution_count"] + 1)
        for key in ("compute_input", "compute_infer", "compute_output"):
            self.assertEqual(a[key]["count"], after["execution_count"], key)
            self.assertGreaterEqual(a[key]["ns"], b[key]["ns"], key)
        self.assertEqual(a["fail"], b["fail"])
        self.assertTrue(t0 <= after["last_inference"] <= t1 + 1,
                        (t0, after["last_inference"], t1))
        # /v1 requests are the same inferences: counted alike
        self.v1(model, self.inputs[model][:1], {})
        (v1,) = self.stats(path)
        self.assertEqual(v1["inference_count"], after["inference_count"] + 1)
        # a request refused counts as a failure, and no inference
        st, _ = self.c.call("POST", "/v1/models/%s/infer" % model,
                            {"tree": "(a b)"})
        self.assertEqual(st, 400)
        (bad,) = self.stats(path)
        self.assertEqual(bad["inference_stats"]["fail"]["count"],
                         a["fail"]["count"] + 1)
        self.assertEqual(bad["inference_count"], v1["inference_count"])
        # a wrong version or method is no inference of the model
        self.assertEqual(self.c.infer(model, self.inputs[model][:1],
                                      version="v9")[0], 404)
        self.assertEqual(self.c.call("GET", "/v2/models/%s/infer"
                                     % model)[0], 405)
        (bad,) = self.stats(path)
        self.assertEqual(bad["inference_stats"]["fail"]["count"],
                         a["fail"]["count"] + 1)
        # the version in the path: the same entry
        v = bad["version"]
        self.assertEqual(self.stats("/v2/models/%s/versions/%s/stats"
                                    % (model, v)), [bad])

    def test_metrics_name_no_empty_model(self):
        """Requests naming no model (health, metadata, unknown routes) are
        counted without a model label, never model=\"\"."""
        self.c.call("GET", "/v2/health/live")
        self.c.call("GET", "/v2/nothing")
        c = http.client.HTTPConnection("127.0.0.1", self.port)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        self.assertNotIn('model=""', text)
        self.assertRegex(text, r'(?m)^canopy_requests_total\{status="404"\} '
                         r'[1-9]')


if __name__ == "__main__":
    unittest.main()
