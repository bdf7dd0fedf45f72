"""The Open Inference Protocol over gRPC (docs/api.md "gRPC") against a
real `canopy serve --grpc-port`, with a client written from the protocol:
its stubs are generated at test time, by python3-grpc-tools' protoc, from
the daemon's own server/grpc_service.proto (the file the daemon is built
from), and every call goes through python3-grpcio (gRPC's C core, the
transport tritonclient.grpc and KServe's client use).

What it proves: health, server and model metadata, Triton's model
configuration, statistics (which move with gRPC inferences as with /v1's)
and repository (index, unload, load); ModelInfer for every family the
tests build, each number of the answer (raw_output_contents, as Triton
returns them) the float32 /v1 prints for the same instance, bit for bit,
with the instances sent as raw_input_contents and as
contents.bytes_contents; the request id echoed; the protocol's status
codes (NOT_FOUND for an unknown model or version, INVALID_ARGUMENT with
the message the HTTP front end gives, RESOURCE_EXHAUSTED when the queue
is full or a message is over grpc-max-message-bytes, UNIMPLEMENTED for a
method not served, UNAVAILABLE while draining); the request id from the
x-request-id metadata, echoed and in the log line with protocol=grpc; the
calls counted by protocol in /metrics; 64 concurrent calls on one channel
all answered right; and a SIGTERM with calls in flight: each is answered,
the connection gets a GOAWAY and is closed, and the daemon exits 0.
A raw HTTP/2 client (frames and HPACK literals from RFC 9113 and 7541)
does what grpcio never does, against a daemon with 1 s timeouts: a
message that stops half-way is DEADLINE_EXCEEDED, an over-long prefix
RESOURCE_EXHAUSTED before the rest is sent, an idle connection gets
GOAWAY and is closed, a window kept shut closes the connection.

Nothing waits on time: each step waits for an event the daemon shows
(/metrics, its log, a socket's state), with daemon_util's deadline only
as a guard against a hang.

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_grpc.py
(env CANOPY_BIN, CANOPY_DATA, CANOPY_CELLS as for the other tests).
"""
import concurrent.futures
import http.client
import importlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import unittest

from daemon_util import DEADLINE_S, free_port, wait_ready, wait_until
from test_kserve import (CELL_MODELS, DATA, MODELS, N, as_cells_model, as_f32,
                         expected, head, pack_elements, per_row_names,
                         split, unpack_tensor)

try:
    import grpc
    import grpc_tools  # noqa: F401 (the stubs' generator, run below)
    MISSING = None
except ImportError as e:  # CI installs both (scripts/deps.sh)
    MISSING = ("python3-grpcio and python3-grpc-tools are needed "
               "(scripts/deps.sh): %s" % e)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("CANOPY_BIN", os.path.join(ROOT, "build", "canopy"))
PROTO = os.path.join(ROOT, "server", "grpc_service.proto")
FLOATS = ("LOGITS", "HIDDEN", "PATH_SCORE")
# grpc-max-message-bytes of the daemon serving every family: every
# request of the tests fits, one of 20,000 tokens does not
MAX_MESSAGE = 65536


def generate_stubs(out):
    """server/grpc_service.proto's Python messages and stubs, generated
    into out; returns (messages module, stubs module)."""
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc",
                    "-I", os.path.dirname(PROTO), "--python_out", out,
                    "--grpc_python_out", out, PROTO],
                   check=True, capture_output=True)
    sys.path.insert(0, out)
    try:
        return (importlib.import_module("grpc_service_pb2"),
                importlib.import_module("grpc_service_pb2_grpc"))
    finally:
        sys.path.remove(out)


def init_models(models, lexicon_lines=3000):
    """The models test_kserve.py serves (every family, two described by
    cells), in models; returns {name: its first N instances}."""
    lex = os.path.join(os.path.dirname(models), "lexicon.txt")
    with open(os.path.join(DATA, "lexicon.txt")) as f, open(lex, "w") as g:
        g.writelines(next(f) for _ in range(lexicon_lines))
    inputs = {}
    for name, (fam, data, extra, _) in MODELS.items():
        extra = ["--lexicon", lex] if extra == ["--lexicon"] else extra
        init_model(fam, os.path.join(models, name), data, 8, 8, extra)
        inputs[name] = head(os.path.join(DATA, data), N)
    for name, (fam, data, desc) in CELL_MODELS.items():
        d = os.path.join(models, name)
        init_model(fam, d, data, 16, 12, [])
        as_cells_model(d, desc)
        inputs[name] = head(os.path.join(DATA, data), N)
    return inputs


def init_model(fam, d, data, hidden, embed, extra):
    subprocess.run([BIN, "model", "init", fam, d, "--hidden", str(hidden),
                    "--embed", str(embed), "--vocab-from",
                    os.path.join(DATA, data), "--seed", "5"] + extra,
                   check=True, capture_output=True)


class Daemon:
    """`canopy serve` on two free loopback ports, HTTP and gRPC, its log
    in a file; ready once /readyz answers and the gRPC channel connects."""

    def __init__(self, tmp, models, *flags):
        self.port, self.gport = free_port(), free_port()
        self.log_path = os.path.join(tmp, "serve-%d.log" % self.port)
        self.log = open(self.log_path, "w")
        env = dict(os.environ,
                   CANOPY_POLICY_CACHE=os.path.join(tmp, "policies"))
        self.p = subprocess.Popen(
            [BIN, "serve", "--models-dir", models, "--port", str(self.port),
             "--grpc-port", str(self.gport)] + list(flags),
            stderr=self.log, env=env)
        self.channel = None
        if not wait_ready("http://127.0.0.1:%d" % self.port, self.p):
            self.stop()
            raise RuntimeError("canopy serve did not start: " + self.text())
        self.channel = self.open_channel()

    def open_channel(self):
        ch = grpc.insecure_channel("127.0.0.1:%d" % self.gport)
        grpc.channel_ready_future(ch).result(timeout=DEADLINE_S)
        return ch

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def http(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port,
                                       timeout=DEADLINE_S)
        try:
            if body is not None and not isinstance(body, bytes):
                body = json.dumps(body).encode()
            c.request(method, path, body=body)
            r = c.getresponse()
            raw = r.read()
            return r.status, (json.loads(raw) if raw[:1] in b"{[" else raw)
        finally:
            c.close()

    def metric(self, prefix):
        """The sum of the /metrics samples whose line starts with prefix
        (a name, or a name and the start of its labels)."""
        st, text = self.http("GET", "/metrics")
        total = 0.0
        for line in text.decode().splitlines():
            if line.startswith(prefix):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        """SIGTERM and the exit status (a clean drain is 0; under ASan a
        leak or error report is not)."""
        if self.channel is not None:
            self.channel.close()
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait(timeout=DEADLINE_S)
        self.log.close()
        return self.p.returncode


class GrpcBase(unittest.TestCase):
    """The stubs, and the calls every test class makes."""

    @classmethod
    def setUpClass(cls):
        if MISSING:
            raise unittest.SkipTest(MISSING)
        cls.tmp = tempfile.mkdtemp(prefix="canopy-grpc-")
        cls.pb, cls.rpc = generate_stubs(os.path.join(cls.tmp))
        cls.daemons = []

    @classmethod
    def tearDownClass(cls):
        bad = []
        for d in cls.daemons:
            code = d.stop()
            if code != 0:
                bad.append("canopy serve exited %d; its log ends:\n%s"
                           % (code, d.text()[-4000:]))
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if bad:
            raise AssertionError("\n".join(bad))

    @classmethod
    def start(cls, models, *flags):
        d = Daemon(cls.tmp, models, *flags)
        cls.daemons.append(d)
        return d

    def stub(self, d, channel=None):
        return self.rpc.GRPCInferenceServiceStub(channel or d.channel)

    def request(self, model, instances, options=None, raw=True,
                version="", rid="", outputs=None):
        """A ModelInferRequest: INSTANCE BYTES [N], each element an
        instance's JSON, as raw_input_contents (tritonclient's way) or as
        contents.bytes_contents; /v1's options as parameters."""
        pb = self.pb
        els = [json.dumps(i).encode() for i in instances]
        req = pb.ModelInferRequest(model_name=model, model_version=version,
                                   id=rid)
        t = req.inputs.add(name="INSTANCE", datatype="BYTES",
                           shape=[len(els)])
        if raw:
            req.raw_input_contents.append(pack_elements(els))
        else:
            t.contents.bytes_contents.extend(els)
        for k, v in (options or {}).items():
            p = req.parameters[k]
            if isinstance(v, bool):
                p.bool_param = v
            elif isinstance(v, int):
                p.int64_param = v
            else:
                p.string_param = v
        for name in outputs or ():
            req.outputs.add(name=name)
        return req

    def decode(self, resp):
        """A ModelInferResponse as the HTTP tests' answer dict: each output
        {"name", "datatype", "shape", "data"}, its data from
        raw_output_contents (one entry per output, in order)."""
        self.assertEqual(len(resp.raw_output_contents), len(resp.outputs))
        outs = []
        for t, raw in zip(resp.outputs, resp.raw_output_contents):
            self.assertFalse(t.HasField("contents"), t.name)
            data = unpack_tensor(t.datatype, raw)
            n = 1
            for s in t.shape:
                n *= s
            self.assertEqual(len(data), n, (t.name, list(t.shape)))
            outs.append({"name": t.name, "datatype": t.datatype,
                         "shape": list(t.shape), "data": data})
        return {"outputs": outs}

    def per_instance(self, d, model, resp, n, options):
        st, m = d.http("GET", "/v2/models/" + model)
        self.assertEqual(st, 200, m)
        return split(self.decode(resp), n, per_row_names(
            m["parameters"]["family"], m["parameters"]["input"], options))

    def assert_code(self, call, code, *words):
        """call() fails with the gRPC status code, its details holding
        words; returns the details."""
        with self.assertRaises(grpc.RpcError) as cm:
            call()
        self.assertEqual(cm.exception.code(), code, cm.exception.details())
        for w in words:
            self.assertIn(w, cm.exception.details())
        return cm.exception.details()


@unittest.skipIf(MISSING, MISSING)
class Grpc(GrpcBase):
    """One daemon serving every family, model-control explicit (load and
    unload on loopback need no token)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        models = os.path.join(cls.tmp, "models")
        cls.inputs = init_models(models)
        # a model of its own for unload and load
        init_model("treelstm", os.path.join(models, "spare"),
                   "trees-binary.jsonl", 8, 8, [])
        try:
            cls.d = cls.start(models, "--workers", "2",
                              "--model-control", "explicit",
                              "--grpc-max-message-bytes", str(MAX_MESSAGE))
        except Exception:
            cls.tearDownClass()
            raise
        cls.s = cls.rpc.GRPCInferenceServiceStub(cls.d.channel)

    def v1(self, model, instances, options):
        st, r = self.d.http("POST", "/v1/models/%s/infer" % model,
                            dict(options, instances=instances))
        self.assertEqual(st, 200, r)
        return r

    def version(self, model):
        st, info = self.d.http("GET", "/v1/models/" + model)
        self.assertEqual(st, 200, info)
        return info["version"]

    # ---- health and metadata -------------------------------------------

    def test_live_and_ready(self):
        pb = self.pb
        self.assertTrue(self.s.ServerLive(pb.ServerLiveRequest()).live)
        self.assertTrue(self.s.ServerReady(pb.ServerReadyRequest()).ready)
        # a model not served is not ready (an answer, not an error)
        self.assertFalse(self.s.ModelReady(pb.ModelReadyRequest(
            name="no-such")).ready)
        for model in list(MODELS) + list(CELL_MODELS):
            r = self.s.ModelReady(pb.ModelReadyRequest(name=model))
            self.assertTrue(r.ready, model)
            r = self.s.ModelReady(pb.ModelReadyRequest(
                name=model, version=self.version(model)))
            self.assertTrue(r.ready, model)

    def test_server_metadata_is_v2s(self):
        r = self.s.ServerMetadata(self.pb.ServerMetadataRequest())
        st, m = self.d.http("GET", "/v2")
        self.assertEqual(st, 200, m)
        self.assertEqual((r.name, r.version, list(r.extensions)),
                         (m["name"], m["version"], m["extensions"]))
        self.assertEqual(r.name, "canopy")

    def test_model_metadata_is_v2s(self):
        """Every model's metadata is /v2's JSON field for field, by name
        and by the version serving."""
        for model in list(MODELS) + list(CELL_MODELS):
            with self.subTest(model=model):
                st, m = self.d.http("GET", "/v2/models/" + model)
                self.assertEqual(st, 200, m)
                for v in ("", m["versions"][0]):
                    r = self.s.ModelMetadata(self.pb.ModelMetadataRequest(
                        name=model, version=v))
                    self.assertEqual(r.name, model)
                    self.assertEqual(list(r.versions), m["versions"])
                    self.assertEqual(r.platform, m["platform"])
                    for got, want in ((r.inputs, m["inputs"]),
                                      (r.outputs, m["outputs"])):
                        self.assertEqual(
                            [{"name": t.name, "datatype": t.datatype,
                              "shape": list(t.shape)} for t in got], want)

    def test_model_config_is_v2s(self):
        """Triton's ModelConfig: the /config JSON's values in
        model_config.proto's fields."""
        pb = self.pb
        for model in list(MODELS) + list(CELL_MODELS):
            with self.subTest(model=model):
                st, cfg = self.d.http("GET", "/v2/models/%s/config" % model)
                self.assertEqual(st, 200, cfg)
                c = self.s.ModelConfig(pb.ModelConfigRequest(
                    name=model)).config
                self.assertEqual((c.name, c.platform, c.backend,
                                  c.max_batch_size),
                                 (cfg["name"], cfg["platform"],
                                  cfg["backend"], cfg["max_batch_size"]))
                self.assertEqual(
                    c.dynamic_batching.max_queue_delay_microseconds,
                    cfg["dynamic_batching"]["max_queue_delay_microseconds"])
                self.assertEqual(c.version_policy.latest.num_versions, 1)
                self.assertEqual(
                    [(i.name, pb.DataType.Name(i.data_type), list(i.dims),
                      list(i.reshape.shape)) for i in c.input],
                    [(i["name"], i["data_type"], i["dims"],
                      i.get("reshape", {}).get("shape", []))
                     for i in cfg["input"]])
                self.assertEqual(
                    [(o.name, pb.DataType.Name(o.data_type), list(o.dims),
                      o.HasField("reshape")) for o in c.output],
                    [(o["name"], o["data_type"], o["dims"], "reshape" in o)
                     for o in cfg["output"]])
                self.assertEqual(
                    [(g.count, pb.ModelInstanceGroup.Kind.Name(g.kind))
                     for g in c.instance_group],
                    [(g["count"], g["kind"]) for g in cfg["instance_group"]])
                self.assertEqual(
                    {k: v.string_value for k, v in c.parameters.items()},
                    {k: v["string_value"]
                     for k, v in cfg["parameters"].items()})

    # ---- inference against /v1 -----------------------------------------

    def check_family(self, model, options, raw=True):
        insts = self.inputs[model]
        ref = self.v1(model, insts, options)
        rid = "grpc-" + model
        resp = self.s.ModelInfer(self.request(model, insts, options, raw,
                                              rid=rid))
        self.assertEqual(resp.id, rid)
        self.assertEqual(resp.model_name, model)
        self.assertEqual(resp.model_version, ref["model_version"])
        per = self.per_instance(self.d, model, resp, len(insts), options)
        for i, (got, v1) in enumerate(zip(per, ref["outputs"])):
            want = {k: as_f32(v) if k in FLOATS else v
                    for k, v in expected(v1).items()}
            self.assertEqual(got, want, "%s instance %d" % (model, i))
        # the run's stats as the answer's parameters, as /v2's JSON has
        # them: /v1's stats keys, integers as int64, the rest as double
        for k, v in ref["stats"].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.assertEqual(resp.parameters[k].WhichOneof(
                    "parameter_choice"), "int64_param" if isinstance(
                        v, int) else "double_param", (model, k))
        types = {"LOGITS": "FP32", "HIDDEN": "FP32", "PATH_SCORE": "FP32",
                 "LABEL": "BYTES", "OUTPUT_TOKENS": "BYTES",
                 "OFFSETS": "INT64"}
        for t in resp.outputs:
            self.assertEqual(t.datatype, types[t.name], t.name)
        return resp

    def test_every_family_equals_v1(self):
        """Every family, hidden states or not, the instances in
        raw_input_contents and in contents.bytes_contents: each number the
        float32 /v1 prints, bit for bit."""
        for model, (_, _, _, options) in MODELS.items():
            for hidden in (False, True):
                for raw in (True, False):
                    with self.subTest(model=model, hidden=hidden, raw=raw):
                        resp = self.check_family(
                            model, dict(options, return_hidden=hidden), raw)
                        self.assertEqual(
                            "HIDDEN" in [t.name for t in resp.outputs],
                            hidden)
        for model in CELL_MODELS:
            for raw in (True, False):
                with self.subTest(model=model, raw=raw):
                    self.check_family(model, {"return_hidden": True}, raw)

    def test_tree_all_nodes(self):
        self.check_family("treelstm", {"outputs": "all",
                                       "return_hidden": True})

    def test_compressed_messages(self):
        """grpcio's gzip and deflate requests (grpc-encoding) are
        inflated: the same answer as uncompressed; one that inflates past
        grpc-max-message-bytes is RESOURCE_EXHAUSTED."""
        insts = self.inputs["treelstm"]
        plain = self.s.ModelInfer(self.request("treelstm", insts))
        for c in (grpc.Compression.Gzip, grpc.Compression.Deflate):
            r = self.s.ModelInfer(self.request("treelstm", insts),
                                  compression=c, timeout=DEADLINE_S)
            self.assertEqual(list(r.raw_output_contents),
                             list(plain.raw_output_contents), c)
        big = [{"tokens": ["w"] * 20000}]  # ~100 KB, gzip: well under 1 KB
        details = self.assert_code(lambda: self.s.ModelInfer(
            self.request("tagger", big), compression=grpc.Compression.Gzip,
            timeout=DEADLINE_S), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("inflates (gzip) to more than %d bytes "
                      "(grpc-max-message-bytes" % MAX_MESSAGE, details)

    def test_version_and_asked_outputs(self):
        """The version serving in model_version; asking for some outputs
        answers those, in the order asked."""
        v = self.version("tagger")
        insts = self.inputs["tagger"][:2]
        r = self.s.ModelInfer(self.request("tagger", insts, version=v))
        self.assertEqual(r.model_version, v)
        r = self.s.ModelInfer(self.request("tagger", insts,
                                           outputs=["LABEL", "OFFSETS"]))
        self.assertEqual([t.name for t in r.outputs], ["LABEL", "OFFSETS"])
        ref = self.v1("tagger", insts, {})["outputs"]
        self.assertEqual(self.decode(r)["outputs"][0]["data"],
                         [t for o in ref for t in o["tag_names"]])

    def test_64_concurrent_calls(self):
        """64 calls in flight at once on one channel (HTTP/2 streams of one
        connection), across families: every answer is /v1's."""
        names = list(MODELS)
        refs = {m: [self.v1(m, [i], MODELS[m][3])["outputs"][0]
                    for i in self.inputs[m]] for m in names}
        calls = []
        for k in range(64):
            m = names[k % len(names)]
            i = (k // len(names)) % N
            req = self.request(m, [self.inputs[m][i]], MODELS[m][3],
                               raw=bool(k % 2), rid="c%d" % k)
            calls.append((m, i, k, self.s.ModelInfer.future(
                req, timeout=DEADLINE_S)))
        bad = []
        for m, i, k, f in calls:
            resp = f.result()
            got = self.per_instance(self.d, m, resp, 1, MODELS[m][3])[0]
            want = {key: as_f32(v) if key in FLOATS else v
                    for key, v in expected(refs[m][i]).items()}
            if got != want or resp.id != "c%d" % k:
                bad.append((k, m, i))
        self.assertEqual(bad, [])

    # ---- statistics, metrics, repository -------------------------------

    def stats(self, model):
        r = self.s.ModelStatistics(self.pb.ModelStatisticsRequest(
            name=model))
        self.assertEqual(len(r.model_stats), 1)
        return r.model_stats[0]

    def test_statistics_count_grpc_inferences(self):
        """A gRPC call of k instances moves the statistics as a /v2 one
        does: inference_count by k, success by one request, execution by
        at least one run; the values are those of /v2's stats route."""
        model = "latticegru"
        before = self.stats(model)
        self.assertEqual(before.name, model)
        self.assertEqual(before.version, self.version(model))
        k = 3
        self.s.ModelInfer(self.request(model, self.inputs[model][:k]))
        after = self.stats(model)
        b, a = before.inference_stats, after.inference_stats
        self.assertEqual(after.inference_count, before.inference_count + k)
        self.assertEqual(a.success.count, b.success.count + 1)
        self.assertGreater(a.success.ns, b.success.ns)
        self.assertEqual(a.queue.count, b.queue.count + 1)
        self.assertGreaterEqual(after.execution_count,
                                before.execution_count + 1)
        self.assertGreaterEqual(after.last_inference, before.last_inference)
        self.assertEqual(a.fail.count, b.fail.count)
        # a refused call counts as a failure, and no inference
        self.assert_code(lambda: self.s.ModelInfer(self.request(
            model, [{"tree": "(a b)"}])), grpc.StatusCode.INVALID_ARGUMENT)
        bad = self.stats(model)
        self.assertEqual(bad.inference_stats.fail.count, a.fail.count + 1)
        self.assertEqual(bad.inference_count, after.inference_count)
        # the same numbers as /v2's statistics
        st, j = self.d.http("GET", "/v2/models/%s/stats" % model)
        self.assertEqual(st, 200, j)
        (js,) = j["model_stats"]
        self.assertEqual((js["inference_count"], js["execution_count"],
                          js["last_inference"]),
                         (bad.inference_count, bad.execution_count,
                          bad.last_inference))
        for key in ("success", "fail", "queue", "compute_input",
                    "compute_infer", "compute_output"):
            got = getattr(bad.inference_stats, key)
            self.assertEqual((got.count, got.ns),
                             (js["inference_stats"][key]["count"],
                              js["inference_stats"][key]["ns"]), key)
        # every model serving, with no name
        r = self.s.ModelStatistics(self.pb.ModelStatisticsRequest())
        st, v1 = self.d.http("GET", "/v1/models")
        self.assertEqual(sorted((s.name, s.version) for s in r.model_stats),
                         sorted((m["name"], m["version"])
                                for m in v1["models"]))

    def test_metrics_count_grpc_with_a_protocol_label(self):
        """A gRPC inference is counted in canopy_requests_total like /v1's
        (by model and status), and as one gRPC request in
        canopy_protocol_requests_total{protocol="grpc"}."""
        def counts():
            return (self.d.metric('canopy_requests_total{model="crf",'
                                  'status="200"}'),
                    self.d.metric('canopy_protocol_requests_total{'
                                  'protocol="grpc"}'))
        (m0, g0) = counts()
        self.s.ModelInfer(self.request("crf", self.inputs["crf"][:1]))
        self.assertEqual(counts(), (m0 + 1, g0 + 1))

    def test_request_id_from_metadata_is_echoed_and_logged(self):
        """x-request-id sent as metadata is the call's request id: echoed
        in the initial metadata and on the log line, which says
        protocol=grpc."""
        q = self.request("treelstm", self.inputs["treelstm"][:1])
        _, call = self.s.ModelInfer.with_call(
            q, metadata=[("x-request-id", "grpc-req-42")], timeout=DEADLINE_S)
        self.assertIn(("x-request-id", "grpc-req-42"),
                      tuple(call.initial_metadata()))
        logged = wait_until(lambda: [ln for ln in self.d.text().splitlines()
                                     if "id=grpc-req-42 " in ln])
        self.assertTrue(logged)
        self.assertIn("protocol=grpc", logged[0])
        self.assertIn("status=200", logged[0])

    def test_repository_index_unload_load(self):
        pb = self.pb
        st, idx = self.d.http("POST", "/v2/repository/index")
        self.assertEqual(st, 200, idx)
        r = self.s.RepositoryIndex(pb.RepositoryIndexRequest())
        self.assertEqual(
            sorted((m.name, m.version, m.state, m.reason) for m in r.models),
            sorted((m["name"], m.get("version", ""), m["state"],
                    m.get("reason", "")) for m in idx))
        self.assertIn(("spare", "READY"),
                      [(m.name, m.state) for m in r.models])
        inst = self.inputs["treelstm"][:1]
        self.s.ModelInfer(self.request("spare", inst))
        # unload: not ready, inference NOT_FOUND naming its state
        self.s.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(
            model_name="spare"))
        self.assertFalse(self.s.ModelReady(pb.ModelReadyRequest(
            name="spare")).ready)
        self.assert_code(lambda: self.s.ModelInfer(
            self.request("spare", inst)), grpc.StatusCode.NOT_FOUND,
            "spare")
        r = self.s.RepositoryIndex(pb.RepositoryIndexRequest())
        self.assertIn(("spare", "UNLOADED"),
                      [(m.name, m.state) for m in r.models])
        # load: ready again, the same answers as before
        self.s.RepositoryModelLoad(pb.RepositoryModelLoadRequest(
            model_name="spare"))
        self.assertTrue(self.s.ModelReady(pb.ModelReadyRequest(
            name="spare")).ready)
        ref = self.v1("spare", inst, {})["outputs"][0]
        got = self.per_instance(self.d, "spare", self.s.ModelInfer(
            self.request("spare", inst)), 1, {})[0]
        self.assertEqual(got, {k: as_f32(v) if k in FLOATS else v
                               for k, v in expected(ref).items()})
        # a directory that is not there: NOT_FOUND, nothing indexed
        self.assert_code(lambda: self.s.RepositoryModelLoad(
            pb.RepositoryModelLoadRequest(model_name="no-such")),
            grpc.StatusCode.NOT_FOUND, "no-such")
        r = self.s.RepositoryIndex(pb.RepositoryIndexRequest())
        self.assertNotIn("no-such", [m.name for m in r.models])

    # ---- errors ----------------------------------------------------------

    def test_streaming_method_is_unimplemented_at_once(self):
        """ModelStreamInfer (what tritonclient.grpc's start_stream opens)
        is not served: the call is answered UNIMPLEMENTED on its headers,
        while the client's side is still open. (Waiting for its end, the
        daemon would answer only at the message deadline, with
        DEADLINE_EXCEEDED.)"""
        more = threading.Event()

        def requests():
            yield b""
            more.wait(DEADLINE_S)  # the client's side stays open

        call = self.d.channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=lambda x: x,
            response_deserializer=lambda x: x)
        try:
            self.assert_code(lambda: list(call(requests(),
                                               timeout=DEADLINE_S)),
                             grpc.StatusCode.UNIMPLEMENTED, "ModelStreamInfer")
        finally:
            more.set()

    def test_not_found(self):
        pb, NF = self.pb, grpc.StatusCode.NOT_FOUND
        inst = self.inputs["treelstm"][:1]
        v = self.version("treelstm")
        self.assert_code(lambda: self.s.ModelInfer(
            self.request("no-such", inst)), NF, "no-such")
        self.assert_code(lambda: self.s.ModelInfer(
            self.request("treelstm", inst, version="v9")), NF,
            "no version 'v9'", v)
        self.assert_code(lambda: self.s.ModelMetadata(
            pb.ModelMetadataRequest(name="no-such")), NF, "no-such")
        self.assert_code(lambda: self.s.ModelMetadata(
            pb.ModelMetadataRequest(name="treelstm", version="v9")), NF,
            "v9")
        self.assert_code(lambda: self.s.ModelConfig(
            pb.ModelConfigRequest(name="no-such")), NF, "no-such")
        self.assert_code(lambda: self.s.ModelStatistics(
            pb.ModelStatisticsRequest(name="treelstm", version="v9")), NF,
            "v9")

    def test_invalid_argument_says_what_http_says(self):
        """Each bad request is INVALID_ARGUMENT with the very message the
        same request gets over HTTP from /v2 (which is /v1's, the instance
        named INSTANCE[i])."""
        IA = grpc.StatusCode.INVALID_ARGUMENT
        good = json.dumps(self.inputs["treelstm"][0])
        cases = [
            # (a request changed from a good one, the same as /v2 JSON)
            ({"tree": "(a (b c)"}, None, None),
            ({"tokens": ["a"]}, None, None),
            ({"tree": "(a b)"}, {"timeout_ms": 0}, None),
            ({"tree": "(a b)"}, {"outputs": "some"}, None),
            ({"tree": "(a b)"}, {"return_hidden": 1}, None),
            ({"tree": "(a b)"}, None, "TEXT"),
        ]
        for inst, params, input_name in cases:
            with self.subTest(inst=inst, params=params, name=input_name):
                req = self.request("treelstm", [inst], params)
                body = {"inputs": [{"name": "INSTANCE", "datatype": "BYTES",
                                    "shape": [1],
                                    "data": [json.dumps(inst)]}]}
                if params:
                    body["parameters"] = params
                if input_name:
                    req.inputs[0].name = input_name
                    body["inputs"][0]["name"] = input_name
                st, http_err = self.d.http(
                    "POST", "/v2/models/treelstm/infer", body)
                self.assertEqual(st, 400, http_err)
                details = self.assert_code(
                    lambda: self.s.ModelInfer(req), IA)
                self.assertEqual(details, http_err["error"])
        # /v1's own message, in the same words, for a bad tree
        st, v1 = self.d.http("POST", "/v1/models/treelstm/infer",
                             {"tree": "(a (b c)"})
        self.assertEqual(st, 400, v1)
        said = v1["error"]["message"].split(": ", 1)[1]
        self.assert_code(lambda: self.s.ModelInfer(self.request(
            "treelstm", [{"tree": "(a (b c)"}])), IA, said)
        # the tensor itself: datatype, shape, elements
        req = self.request("treelstm", [json.loads(good)])
        req.inputs[0].datatype = "FP32"
        self.assert_code(lambda: self.s.ModelInfer(req), IA, "FP32",
                         "BYTES")
        req = self.request("treelstm", [json.loads(good)])
        req.inputs[0].shape[:] = [2]
        self.assert_code(lambda: self.s.ModelInfer(req), IA, "shape")
        req = self.request("treelstm", [json.loads(good)])
        req.raw_input_contents[0] = b"\xff\xff\xff\x7f" + good.encode()
        self.assert_code(lambda: self.s.ModelInfer(req), IA, "INSTANCE[0]")
        req = self.request("treelstm", [json.loads(good)])
        req.raw_input_contents[0] = pack_elements([b"(a b)"])
        self.assert_code(lambda: self.s.ModelInfer(req), IA, "INSTANCE[0]")
        # a message over grpc-max-message-bytes
        self.assert_code(lambda: self.s.ModelInfer(self.request(
            "tagger", [{"tokens": ["w"] * 20000}])),
            grpc.StatusCode.RESOURCE_EXHAUSTED)
        # a method the daemon does not serve
        unknown = self.d.channel.unary_unary(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=lambda x: x,
            response_deserializer=lambda x: x)
        self.assert_code(lambda: unknown(b"", timeout=DEADLINE_S),
                         grpc.StatusCode.UNIMPLEMENTED)
        # and the daemon answers on
        self.check_family("treelstm", {})


@unittest.skipIf(MISSING, MISSING)
class GrpcQueueAndDrain(GrpcBase):
    """A daemon whose aggregation window closes only when its time runs
    out (work-conserving false) holds the requests it accepted, so that
    the queue is full, or calls are in flight, for as long as a test
    looks, with no timing: each step waits for the metric or log line
    that says the state is reached."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.models = os.path.join(cls.tmp, "models")
        init_model("treelstm", os.path.join(cls.models, "treelstm"),
                   "trees-binary.jsonl", 8, 8, [])
        cls.insts = head(os.path.join(DATA, "trees-binary.jsonl"), 16)

    def test_full_queue_is_resource_exhausted(self):
        """One worker, a queue of 2 instances and a 60 s window: one /v1
        instance waiting in the window fills half of it, and a gRPC call
        of two instances does not fit: RESOURCE_EXHAUSTED, counted as
        HTTP's 429 is. The /v1 client then goes away and its instance is
        dropped (the queue is empty again)."""
        d = self.start(self.models, "--workers", "1", "--queue-depth", "2",
                       "--max-delay-us", "60000000",
                       "--work-conserving", "false")
        s = self.stub(d)
        c = http.client.HTTPConnection("127.0.0.1", d.port,
                                       timeout=DEADLINE_S)
        c.request("POST", "/v1/models/treelstm/infer",
                  json.dumps(self.insts[0]).encode())
        self.assertEqual(wait_until(lambda: d.metric(
            "canopy_queue_depth_instances"), lambda v: v == 1), 1)
        before = d.metric("canopy_requests_rejected_overloaded_total")
        self.assert_code(lambda: s.ModelInfer(self.request(
            "treelstm", self.insts[:2])),
            grpc.StatusCode.RESOURCE_EXHAUSTED, "queue")
        self.assertEqual(d.metric(
            "canopy_requests_rejected_overloaded_total"), before + 1)
        c.close()
        self.assertEqual(wait_until(lambda: d.metric(
            "canopy_queue_depth_instances"), lambda v: v == 0), 0)

    def test_drain_answers_calls_in_flight_then_goaway(self):
        """SIGTERM with 16 gRPC calls in flight (held in a 3 s window):
        a new call is UNAVAILABLE, each call in flight gets its right
        answer, the connections get a GOAWAY frame and are closed, and
        the daemon exits 0."""
        d = self.start(self.models, "--workers", "1",
                       "--max-delay-us", "3000000",
                       "--work-conserving", "false")
        s = self.stub(d)
        # the references: one /v1 request of the 16 (one window)
        st, r = d.http("POST", "/v1/models/treelstm/infer",
                       {"instances": self.insts})
        self.assertEqual(st, 200, r)
        ref = r["outputs"]
        # a second connection, raw HTTP/2: the preface and SETTINGS, the
        # server's SETTINGS acknowledged; after SIGTERM it must see GOAWAY
        h2 = socket.create_connection(("127.0.0.1", d.gport),
                                      timeout=DEADLINE_S)
        h2.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                   + frame(4, 0, 0, b""))
        frames = read_frames(h2, until=lambda f: f[0] == 4 and not f[1] & 1)
        self.assertTrue(frames and frames[-1][0] == 4, frames)
        h2.sendall(frame(4, 1, 0, b""))
        base = d.metric("canopy_in_flight_requests")
        calls = [s.ModelInfer.future(self.request("treelstm", [inst]),
                                     timeout=DEADLINE_S)
                 for inst in self.insts]
        self.assertEqual(wait_until(
            lambda: d.metric("canopy_in_flight_requests"),
            lambda v: v == base + len(calls)), base + len(calls))
        d.p.send_signal(signal.SIGTERM)
        self.assertTrue(wait_until(lambda: "msg=draining" in d.text()),
                        d.text()[-2000:])
        # draining: a new call is UNAVAILABLE, on the channel in use or
        # a new one
        self.assert_code(lambda: s.ModelInfer(self.request(
            "treelstm", self.insts[:1])), grpc.StatusCode.UNAVAILABLE)
        ch = grpc.insecure_channel("127.0.0.1:%d" % d.gport)
        self.assert_code(lambda: self.stub(d, ch).ModelInfer(self.request(
            "treelstm", self.insts[:1]), timeout=DEADLINE_S),
            grpc.StatusCode.UNAVAILABLE)
        ch.close()
        for k, f in enumerate(calls):
            resp = f.result()
            got = self.per_instance_no_http(resp)
            want = {key: as_f32(v) if key in FLOATS else v
                    for key, v in expected(ref[k]).items()}
            self.assertEqual(got, want, "call %d" % k)
        types = [f[0] for f in read_frames(h2, until=None)]
        self.assertIn(7, types, "no GOAWAY before the connection closed")
        h2.close()
        self.assertEqual(d.p.wait(timeout=DEADLINE_S), 0, d.text()[-4000:])
        self.assertIn("msg=drained", d.text())

    def per_instance_no_http(self, resp):
        """A tree model's one-instance answer (outputs "root"): the row of
        each output (the HTTP port is closed by now)."""
        return split(self.decode(resp), 1, set())[0]


def frame(ftype, flags, stream, payload=b""):
    """One HTTP/2 frame (RFC 9113 section 4.1)."""
    n = len(payload)
    return (struct.pack(">BHBBI", n >> 16, n & 0xffff, ftype, flags,
                        stream) + payload)


def read_frames(sock, until):
    """HTTP/2 frames read from sock as (type, flags, stream, payload):
    up to and including the first for which until(frame) holds, or, with
    until None, up to the connection's end."""
    buf, out = b"", []
    while True:
        while len(buf) >= 9:
            hi, lo, ftype, flags, stream = struct.unpack(">BHBBI", buf[:9])
            n = (hi << 16) | lo
            if len(buf) < 9 + n:
                break
            f = (ftype, flags, stream & 0x7fffffff, buf[9:9 + n])
            buf = buf[9 + n:]
            out.append(f)
            if until is not None and until(f):
                return out
        try:
            b = sock.recv(65536)
        except ConnectionResetError:
            b = b""
        if not b:
            return out
        buf += b


def header_block(fields):
    """HPACK literals without indexing, new names, no Huffman (RFC 7541
    6.2.2): enough for a client, no table to keep."""
    out = b""
    for k, v in fields:
        k, v = k.encode(), v.encode()
        assert len(k) < 127 and len(v) < 127
        out += b"\x00" + bytes([len(k)]) + k + bytes([len(v)]) + v
    return out


class RawH2:
    """A gRPC client at the frame level, written from RFC 9113 and gRPC's
    HTTP/2 mapping, for what grpcio never does: a message that stops
    half-way, a window kept shut, a connection left idle."""

    def __init__(self, port, window=65535):
        import socket
        self.s = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" +
                       frame(4, 0, 0, struct.pack(">HI", 4, window)))

    def call(self, stream, method, message=None, end=True):
        self.s.sendall(frame(1, 4 | (1 if message is None and end else 0),
                             stream, header_block([
                                 (":method", "POST"), (":scheme", "http"),
                                 (":path", "/inference.GRPCInferenceService/"
                                  + method),
                                 (":authority", "canopy"),
                                 ("content-type", "application/grpc"),
                                 ("te", "trailers")])))
        if message is not None:
            self.s.sendall(frame(0, 1 if end else 0, stream, message))

    def frames_until_close(self):
        """The server's frames (type, flags, stream) until it closes the
        connection (the test's deadline guards a server that never does)."""
        buf, out = b"", []
        while True:
            d = self.s.recv(65536)
            if not d:
                return out
            buf += d
            while len(buf) >= 9:
                n = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + n:
                    break
                out.append((buf[3], buf[4],
                            int.from_bytes(buf[5:9], "big") & 0x7fffffff))
                buf = buf[9 + n:]

    def close(self):
        self.s.close()


def grpc_message(payload):
    """A gRPC length-prefixed message (uncompressed)."""
    return b"\x00" + struct.pack(">I", len(payload)) + payload


class TestGrpcBounds(unittest.TestCase):
    """The limits of docs/api.md "gRPC" on peers grpcio does not imitate,
    against a daemon whose timeouts are 1 s; each test waits for the event
    (the server's log line, its frames, its close), never for a time."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="canopy-grpc-bounds-")
        models = os.path.join(cls.tmp, "models")
        subprocess.run([BIN, "model", "init", "bilstm-tagger",
                        os.path.join(models, "tagger"), "--hidden", "8",
                        "--embed", "8", "--seed", "5"],
                       check=True, capture_output=True)
        cls.port, cls.gport = free_port(), free_port()
        cls.log_path = os.path.join(cls.tmp, "serve.log")
        cls.log = open(cls.log_path, "w")
        cls.daemon = subprocess.Popen(
            [BIN, "serve", "--models-dir", models, "--port", str(cls.port),
             "--grpc-port", str(cls.gport), "--log-level", "debug",
             "--idle-timeout-s", "1", "--header-timeout-s", "1",
             "--body-timeout-s", "1", "--grpc-max-message-bytes", "1024"],
            stderr=cls.log, env=dict(os.environ, CANOPY_POLICY_CACHE=
                                     os.path.join(cls.tmp, "p")))
        if not wait_ready("http://127.0.0.1:%d" % cls.port, cls.daemon):
            cls.tearDownClass()
            raise RuntimeError("canopy serve was not ready")

    @classmethod
    def tearDownClass(cls):
        if cls.daemon.poll() is None:
            cls.daemon.terminate()
        rc = cls.daemon.wait(timeout=60)
        cls.log.close()
        with open(cls.log_path) as f:
            log = f.read()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if rc != 0:
            raise AssertionError("canopy serve exited %d:\n%s" %
                                 (rc, log[-4000:]))

    def logged(self, text):
        def lines():
            with open(self.log_path) as f:
                return [l for l in f if text in l]
        return wait_until(lines)

    def test_message_that_stops_half_way(self):
        """A call whose message never ends: DEADLINE_EXCEEDED (4) after
        header-timeout-s + body-timeout-s, as HTTP's 408."""
        c = RawH2(self.gport)
        c.call(1, "ModelInfer", grpc_message(b"\x0a\x06tagger")[:6],
               end=False)
        self.assertTrue(self.logged("msg=grpc-call method=ModelInfer "
                                    "stream=1 grpc_status=4"))
        c.close()

    def test_message_over_the_limit_refused_at_once(self):
        """A prefix that says more than grpc-max-message-bytes:
        RESOURCE_EXHAUSTED (8) without the rest being sent."""
        c = RawH2(self.gport)
        c.call(3, "ModelInfer", b"\x00" + struct.pack(">I", 1 << 20) +
               b"x" * 10, end=False)
        self.assertTrue(self.logged("msg=grpc-call method=ModelInfer "
                                    "stream=3 grpc_status=8"))
        c.close()

    def test_idle_connection_gets_goaway_and_closes(self):
        c = RawH2(self.gport)
        c.call(1, "ServerLive", grpc_message(b""))
        frames = c.frames_until_close()
        c.close()
        types = [t for t, _, _ in frames]
        self.assertIn(1, types)  # the answer's HEADERS
        self.assertEqual(types[-1], 7)  # GOAWAY, then the close

    def test_window_kept_shut_closes_the_connection(self):
        """A peer that never opens its window: the answer cannot move and
        the connection is closed after idle-timeout-s."""
        c = RawH2(self.gport, window=0)
        c.call(1, "ServerMetadata", grpc_message(b""))
        frames = c.frames_until_close()
        c.close()
        self.assertFalse([f for f in frames if f[0] == 0 and f[2] == 1])
        self.assertTrue(self.logged("msg=grpc-connection-stalled"))


if __name__ == "__main__":
    unittest.main()
