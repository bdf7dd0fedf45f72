"""The gRPC front end (docs/api.md "gRPC") against a real `canopy serve`
on free ports, with a client made from the protocol's service definition:
the stubs are generated at test time from server/grpc_service.proto by
Debian's python3-grpc-tools, and called through python3-grpcio.

Checked: ServerLive, ServerReady, ServerMetadata, ModelReady (a model not
served is not ready), ModelMetadata, ModelConfig, ModelStatistics and
RepositoryIndex against the /v2 JSON answers they are made from;
ModelInfer on a tagger and a tree model, with its instances sent both as
contents.bytes_contents and as raw_input_contents, whose LOGITS are the
float32 bit patterns of the numbers /v1 prints for the same instances
(and whose labels and offsets are /v1's); the request id both ways; the
errors (NOT_FOUND for an unknown model or version, INVALID_ARGUMENT with
/v1's message, RESOURCE_EXHAUSTED over grpc-max-message-bytes,
UNIMPLEMENTED for a method not served); the calls counted under
protocol="grpc" in /metrics; the bounds on peers grpcio does not imitate
(a raw HTTP/2 client: a message that stops half-way, an over-long
prefix, an idle connection, a window kept shut); and a SIGTERM with a
call in flight, which is answered before the daemon exits 0.

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_grpc.py
(env CANOPY_BIN, CANOPY_DATA as for the other tests).
"""
import http.client
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import unittest
import urllib.request

from daemon_util import free_port, wait_ready, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("CANOPY_BIN", os.path.join(ROOT, "build", "canopy"))
DATA = os.environ.get("CANOPY_DATA", os.path.join(ROOT, "data"))
PROTO = os.path.join(ROOT, "server", "grpc_service.proto")
N = 4  # instances a request
MAX_MESSAGE = 4096

try:
    import grpc
    from grpc_tools import protoc
except ImportError:  # the suite's deps install them (scripts/deps.sh)
    grpc = None


def head(path, n):
    with open(path) as f:
        return [json.loads(next(f)) for _ in range(n)]


def stubs(tmp):
    """grpc_service_pb2 and its _grpc module, generated from the .proto."""
    out = os.path.join(tmp, "stubs")
    os.makedirs(out)
    rc = protoc.main(["protoc", "-I" + os.path.dirname(PROTO),
                      "--python_out=" + out, "--grpc_python_out=" + out,
                      PROTO])
    assert rc == 0, "protoc failed on " + PROTO
    sys.path.insert(0, out)
    import grpc_service_pb2 as pb
    import grpc_service_pb2_grpc as pbg
    return pb, pbg


def f32_bytes(values):
    """/v1's printed numbers as the float32s they read back as."""
    return struct.pack("<%df" % len(values), *values)


def bytes_elements(raw):
    """A BYTES tensor's raw contents: 4-byte little-endian lengths and
    bytes."""
    out, off = [], 0
    while off < len(raw):
        n, = struct.unpack_from("<I", raw, off)
        out.append(raw[off + 4:off + 4 + n].decode())
        off += 4 + n
    assert off == len(raw)
    return out


@unittest.skipIf(grpc is None, "python3-grpcio / python3-grpc-tools missing")
class TestGrpc(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="canopy-grpc-")
        cls.pb, pbg = stubs(cls.tmp)
        models = os.path.join(cls.tmp, "models")
        for name, fam, data in (("tagger", "bilstm-tagger", "sequences.jsonl"),
                                ("tree", "treelstm", "trees-binary.jsonl"),
                                ("spare", "treelstm", "trees-binary.jsonl")):
            subprocess.run([BIN, "model", "init", fam,
                            os.path.join(models, name), "--hidden", "8",
                            "--embed", "8", "--vocab-from",
                            os.path.join(DATA, data), "--seed", "5"],
                           check=True, capture_output=True)
        cls.inputs = {"tagger": head(os.path.join(DATA, "sequences.jsonl"), N),
                      "tree": head(os.path.join(DATA, "trees-binary.jsonl"),
                                   N)}
        cls.port, cls.gport = free_port(), free_port()
        cls.log_path = os.path.join(cls.tmp, "serve.log")
        cls.log = open(cls.log_path, "w")
        env = dict(os.environ,
                   CANOPY_POLICY_CACHE=os.path.join(cls.tmp, "policies"))
        cls.daemon = subprocess.Popen(
            [BIN, "serve", "--models-dir", models, "--port", str(cls.port),
             "--grpc-port", str(cls.gport), "--workers", "2",
             "--grpc-max-message-bytes", str(MAX_MESSAGE),
             "--model-control", "explicit"],
            stderr=cls.log, env=env)
        if not wait_ready("http://127.0.0.1:%d" % cls.port, cls.daemon):
            cls.tearDownClass()
            raise RuntimeError("canopy serve was not ready")
        cls.channel = grpc.insecure_channel("127.0.0.1:%d" % cls.gport)
        cls.s = pbg.GRPCInferenceServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        """SIGTERM; the daemon must drain and exit 0 (under ASan a leak or
        an error exits otherwise, and fails the test)."""
        if getattr(cls, "channel", None) is not None:
            cls.channel.close()
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

    # ---- helpers ---------------------------------------------------------

    def http(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request(method, path, body=json.dumps(body) if body is not None
                  else None)
        r = c.getresponse()
        raw = r.read()
        c.close()
        return r.status, (json.loads(raw) if raw and
                          r.getheader("Content-Type") == "application/json"
                          else raw.decode())

    def infer_request(self, model, instances, raw=False, **kw):
        pb = self.pb
        els = [json.dumps(i).encode() for i in instances]
        t = pb.ModelInferRequest.InferInputTensor(
            name="INSTANCE", datatype="BYTES", shape=[len(els)])
        q = pb.ModelInferRequest(model_name=model, inputs=[t], **kw)
        if raw:
            q.raw_input_contents.append(
                b"".join(struct.pack("<I", len(e)) + e for e in els))
        else:
            t.contents.bytes_contents.extend(els)
            q.inputs[0].CopyFrom(t)
        return q

    def assert_code(self, fn, req, code, text=None):
        with self.assertRaises(grpc.RpcError) as cm:
            fn(req, timeout=60)
        self.assertEqual(cm.exception.code(), code,
                         cm.exception.details())
        if text is not None:
            self.assertEqual(cm.exception.details(), text)
        return cm.exception.details()

    # ---- health and metadata --------------------------------------------

    def test_health(self):
        pb = self.pb
        self.assertTrue(self.s.ServerLive(pb.ServerLiveRequest()).live)
        self.assertTrue(self.s.ServerReady(pb.ServerReadyRequest()).ready)
        self.assertTrue(self.s.ModelReady(
            pb.ModelReadyRequest(name="tagger")).ready)
        self.assertFalse(self.s.ModelReady(
            pb.ModelReadyRequest(name="nothing")).ready)

    def test_metadata_as_v2(self):
        pb = self.pb
        st, v2 = self.http("GET", "/v2")
        m = self.s.ServerMetadata(pb.ServerMetadataRequest())
        self.assertEqual((m.name, m.version, list(m.extensions)),
                         (v2["name"], v2["version"], v2["extensions"]))
        for model in ("tagger", "tree"):
            st, v2 = self.http("GET", "/v2/models/" + model)
            self.assertEqual(st, 200)
            m = self.s.ModelMetadata(pb.ModelMetadataRequest(name=model))
            self.assertEqual(m.name, v2["name"])
            self.assertEqual(list(m.versions), v2["versions"])
            self.assertEqual(m.platform, v2["platform"])
            for got, want in ((m.inputs, v2["inputs"]),
                              (m.outputs, v2["outputs"])):
                self.assertEqual(
                    [(t.name, t.datatype, list(t.shape)) for t in got],
                    [(t["name"], t["datatype"], t["shape"]) for t in want])
            # the version serving, named
            v = v2["versions"][0]
            self.assertEqual(self.s.ModelMetadata(pb.ModelMetadataRequest(
                name=model, version=v)).versions, [v])

    def test_config_stats_index(self):
        pb = self.pb
        st, cfg = self.http("GET", "/v2/models/tagger/config")
        c = self.s.ModelConfig(pb.ModelConfigRequest(name="tagger")).config
        self.assertEqual((c.name, c.platform, c.backend, c.max_batch_size),
                         (cfg["name"], cfg["platform"], cfg["backend"],
                          cfg["max_batch_size"]))
        self.assertEqual([(t.name, pb.DataType.Name(t.data_type),
                           list(t.dims)) for t in c.output],
                         [(t["name"], t["data_type"], t["dims"])
                          for t in cfg["output"]])
        self.assertEqual(c.dynamic_batching.max_queue_delay_microseconds,
                         cfg["dynamic_batching"]
                         ["max_queue_delay_microseconds"])
        self.assertEqual(c.parameters["family"].string_value,
                         "bilstm-tagger")
        # statistics: after one inference the count moved by its instances
        before = self.s.ModelStatistics(
            pb.ModelStatisticsRequest(name="tree")).model_stats[0]
        self.s.ModelInfer(self.infer_request("tree", self.inputs["tree"]),
                          timeout=60)
        after = self.s.ModelStatistics(
            pb.ModelStatisticsRequest(name="tree")).model_stats[0]
        self.assertEqual(after.inference_count - before.inference_count, N)
        self.assertEqual(after.inference_stats.success.count -
                         before.inference_stats.success.count, 1)
        allm = self.s.ModelStatistics(pb.ModelStatisticsRequest())
        self.assertEqual(sorted(m.name for m in allm.model_stats),
                         ["spare", "tagger", "tree"])
        idx = self.s.RepositoryIndex(pb.RepositoryIndexRequest())
        st, v2 = self.http("POST", "/v2/repository/index", {})
        self.assertEqual([(m.name, m.version, m.state) for m in idx.models],
                         [(m["name"], m.get("version", ""), m["state"])
                          for m in v2])

    def test_unload_and_load(self):
        """RepositoryModelUnload stops a model serving (ModelReady false,
        ModelInfer the status and message /v2 gives: NOT_FOUND), and
        RepositoryModelLoad brings it back; each answered once done."""
        pb = self.pb
        self.s.RepositoryModelUnload(
            pb.RepositoryModelUnloadRequest(model_name="spare"), timeout=60)
        self.assertFalse(self.s.ModelReady(
            pb.ModelReadyRequest(name="spare")).ready)
        st, v2 = self.http("POST", "/v2/models/spare/infer", {
            "inputs": [{"name": "INSTANCE", "datatype": "BYTES",
                        "shape": [1],
                        "data": [json.dumps(self.inputs["tree"][0])]}]})
        self.assertEqual(st, 404)
        self.assert_code(self.s.ModelInfer,
                         self.infer_request("spare", self.inputs["tree"][:1]),
                         grpc.StatusCode.NOT_FOUND, v2["error"])
        self.s.RepositoryModelLoad(
            pb.RepositoryModelLoadRequest(model_name="spare"), timeout=60)
        self.assertTrue(self.s.ModelReady(
            pb.ModelReadyRequest(name="spare")).ready)
        r = self.s.ModelInfer(self.infer_request(
            "spare", self.inputs["tree"][:1]), timeout=60)
        self.assertEqual(r.model_name, "spare")

    # ---- inference --------------------------------------------------------

    def check_infer(self, model, raw):
        insts = self.inputs[model]
        st, v1 = self.http("POST", "/v1/models/%s/infer" % model,
                           {"instances": insts})
        self.assertEqual(st, 200, v1)
        r = self.s.ModelInfer(self.infer_request(model, insts, raw=raw,
                                                 id="call-7"), timeout=60)
        self.assertEqual((r.model_name, r.model_version, r.id),
                         (model, v1["model_version"], "call-7"))
        outs = {o.name: (o, r.raw_output_contents[i])
                for i, o in enumerate(r.outputs)}
        self.assertEqual(len(r.raw_output_contents), len(r.outputs))
        o, logits = outs["LOGITS"]
        self.assertEqual(o.datatype, "FP32")
        if model == "tagger":  # a row a token, OFFSETS per instance
            rows = [row for out in v1["outputs"] for row in out["logits"]]
            labels = [t for out in v1["outputs"] for t in out["tag_names"]]
            off = struct.unpack_from("<%dq" % (N + 1), outs["OFFSETS"][1])
            lens = [len(out["logits"]) for out in v1["outputs"]]
            self.assertEqual(list(off), [sum(lens[:i]) for i in range(N + 1)])
        else:
            rows = [out["logits"] for out in v1["outputs"]]
            labels = [out["label_name"] for out in v1["outputs"]]
        self.assertEqual(list(o.shape), [len(rows), len(rows[0])])
        # bit for bit: the float32s /v1 prints
        self.assertEqual(logits, f32_bytes([x for row in rows for x in row]))
        self.assertEqual(bytes_elements(outs["LABEL"][1]), labels)
        self.assertEqual(r.parameters["run_instances"].WhichOneof(
            "parameter_choice"), "int64_param")

    def test_infer_bytes_contents_as_v1(self):
        self.check_infer("tagger", raw=False)
        self.check_infer("tree", raw=False)

    def test_infer_raw_contents_as_v1(self):
        self.check_infer("tagger", raw=True)
        self.check_infer("tree", raw=True)

    def test_compressed_messages(self):
        """grpcio's gzip and deflate requests are inflated (the same
        answer as uncompressed); one that inflates past
        grpc-max-message-bytes is RESOURCE_EXHAUSTED."""
        insts = self.inputs["tree"]
        plain = self.s.ModelInfer(self.infer_request("tree", insts),
                                  timeout=60)
        for c in (grpc.Compression.Gzip, grpc.Compression.Deflate):
            r = self.s.ModelInfer(self.infer_request("tree", insts),
                                  compression=c, timeout=60)
            self.assertEqual(list(r.raw_output_contents),
                             list(plain.raw_output_contents))
        big = [{"tokens": ["w"] * 2000}]  # ~10 KB, compresses to ~100 B
        details = self.assert_code(
            lambda q, timeout: self.s.ModelInfer(
                q, compression=grpc.Compression.Gzip, timeout=timeout),
            self.infer_request("tagger", big),
            grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("inflates (gzip) to more than %d bytes "
                      "(grpc-max-message-bytes" % MAX_MESSAGE, details)

    def test_request_id_and_metrics(self):
        _, m0 = self.http("GET", "/metrics")
        q = self.infer_request("tree", self.inputs["tree"][:1])
        _, call = self.s.ModelInfer.with_call(
            q, metadata=[("x-request-id", "grpc-req-42")], timeout=60)
        self.assertIn(("x-request-id", "grpc-req-42"),
                      tuple(call.initial_metadata()))

        def counted(text):
            for line in text.splitlines():
                if line.startswith('canopy_protocol_requests_total'
                                   '{protocol="grpc"} '):
                    return int(line.split()[1])
            return None
        st, m1 = self.http("GET", "/metrics")
        self.assertGreater(counted(m1), counted(m0))
        def lines():
            with open(self.log_path) as f:
                return [l for l in f if "id=grpc-req-42 " in l]
        logged = wait_until(lines)
        self.assertTrue(logged)
        self.assertIn("protocol=grpc", logged[0])
        self.assertIn("status=200", logged[0])

    # ---- errors -----------------------------------------------------------

    def test_errors(self):
        pb = self.pb
        C = grpc.StatusCode
        self.assert_code(self.s.ModelInfer, self.infer_request(
            "nothing", self.inputs["tree"]), C.NOT_FOUND)
        self.assert_code(self.s.ModelMetadata,
                         pb.ModelMetadataRequest(name="nothing"), C.NOT_FOUND)
        self.assert_code(self.s.ModelInfer, self.infer_request(
            "tree", self.inputs["tree"], model_version="nope"), C.NOT_FOUND)
        # a bad instance: /v2's message for it, which is /v1's
        bad = [{"tokens": 3}]
        st, v1 = self.http("POST", "/v1/models/tagger/infer",
                           {"instances": bad})
        st2, v2 = self.http("POST", "/v2/models/tagger/infer", {
            "inputs": [{"name": "INSTANCE", "datatype": "BYTES",
                        "shape": [1], "data": [json.dumps(bad[0])]}]})
        self.assertEqual((st, st2), (400, 400))
        self.assertIn(v1["error"]["message"], v2["error"])
        self.assert_code(self.s.ModelInfer,
                         self.infer_request("tagger", bad),
                         C.INVALID_ARGUMENT, v2["error"])
        # over grpc-max-message-bytes
        big = [{"tokens": ["w"] * 2000}]
        self.assert_code(self.s.ModelInfer, self.infer_request("tagger", big),
                         C.RESOURCE_EXHAUSTED)
        # a method the daemon does not serve
        unknown = self.channel.unary_unary(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=lambda x: x, response_deserializer=lambda x: x)
        self.assert_code(unknown, b"", C.UNIMPLEMENTED)


def frame(ftype, flags, stream, payload=b""):
    """One HTTP/2 frame (RFC 9113 4.1)."""
    return (struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) +
            struct.pack(">I", stream) + payload)


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


@unittest.skipIf(grpc is None, "python3-grpcio / python3-grpc-tools missing")
class TestGrpcDrain(unittest.TestCase):
    def test_sigterm_answers_calls_in_flight_then_exits_zero(self):
        """SIGTERM while a call waits in its aggregation window (2 s, not
        work-conserving): the connection gets GOAWAY, the call is still
        answered with /v1's numbers, the daemon exits 0, and a call after
        it is UNAVAILABLE."""
        tmp = tempfile.mkdtemp(prefix="canopy-grpc-drain-")
        try:
            pb, pbg = stubs(tmp)
            models = os.path.join(tmp, "models")
            subprocess.run([BIN, "model", "init", "treelstm",
                            os.path.join(models, "tree"), "--hidden", "8",
                            "--embed", "8", "--seed", "5"],
                           check=True, capture_output=True)
            port, gport = free_port(), free_port()
            tree = {"tree": "(3 (2 It) (4 (2 's) (2 fine)))"}
            with open(os.path.join(tmp, "serve.log"), "w") as log:
                d = subprocess.Popen(
                    [BIN, "serve", "--models-dir", models, "--port",
                     str(port), "--grpc-port", str(gport),
                     "--work-conserving", "false", "--max-delay-us",
                     "2000000"],
                    stderr=log, env=dict(os.environ, CANOPY_POLICY_CACHE=
                                         os.path.join(tmp, "p")))
                url = "http://127.0.0.1:%d" % port
                self.assertTrue(wait_ready(url, d))
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                c.request("POST", "/v1/models/tree/infer",
                          json.dumps({"instances": [tree]}))
                v1 = json.loads(c.getresponse().read())
                c.close()
                ch = grpc.insecure_channel("127.0.0.1:%d" % gport)
                s = pbg.GRPCInferenceServiceStub(ch)
                t = pb.ModelInferRequest.InferInputTensor(
                    name="INSTANCE", datatype="BYTES", shape=[1])
                t.contents.bytes_contents.append(json.dumps(tree).encode())
                fut = s.ModelInfer.future(pb.ModelInferRequest(
                    model_name="tree", inputs=[t]), timeout=60)

                def in_flight():
                    with urllib.request.urlopen(url + "/metrics") as r:
                        for line in r.read().decode().splitlines():
                            if line.startswith("canopy_in_flight_requests "):
                                return float(line.split()[1])
                self.assertEqual(wait_until(in_flight, lambda v: v == 1), 1)
                d.send_signal(signal.SIGTERM)
                r = fut.result(timeout=60)
                logits = r.raw_output_contents[
                    [o.name for o in r.outputs].index("LOGITS")]
                self.assertEqual(logits,
                                 f32_bytes(v1["outputs"][0]["logits"]))
                self.assertEqual(d.wait(timeout=60), 0)
                with self.assertRaises(grpc.RpcError) as cm:
                    s.ServerLive(pb.ServerLiveRequest(), timeout=60)
                self.assertEqual(cm.exception.code(),
                                 grpc.StatusCode.UNAVAILABLE)
                ch.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
