"""A /v1 body read without a DOM (server/infer.c read_direct: the common
shape, {"instances": [...]} and nothing else, or one INSTANCE alone)
against the same instances read through jansson (the body with an
option key, "outputs": "root", which is the default and sends it down
the DOM path). For trees, sequences and DAGs, on data/'s lines: the
answers' outputs are byte for byte the same, with any whitespace around
the envelope's tokens; and a body with a bad instance after good ones,
or a bad envelope, gets the same error either way (the DOM path writes
every error).

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_serve_direct.py
(env CANOPY_BIN, CANOPY_DATA as for the other tests).
"""
import http.client
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest
from daemon_util import BIN, DATA, free_port, wait_ready

FAMILIES = [("treelstm", "trees-binary.jsonl", '{"tree": "(S (N a"}'),
            ("bilstm-tagger", "sequences.jsonl", '{"tokens": []}'),
            ("latticegru", "dags.jsonl", '{"nodes": [{"token": 3}]}')]
LINES = 40


def outputs(text):
    """The raw text of an answer's "outputs" array."""
    m = re.search(r'"outputs":(\[.*\]),"stats":', text)
    return m.group(1) if m else None


class DirectBody(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="canopy-direct-")
        models = os.path.join(cls.tmp, "models")
        os.mkdir(models)
        for fam, data, _ in FAMILIES:
            subprocess.run([BIN, "model", "init", fam,
                            os.path.join(models, fam), "--hidden", "8",
                            "--embed", "8", "--classes", "5", "--vocab-from",
                            os.path.join(DATA, data)], check=True,
                           stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        cls.port = free_port()
        cls.log = open(os.path.join(cls.tmp, "log"), "w")
        cls.d = subprocess.Popen([BIN, "serve", "--models-dir", models,
                                  "--port", str(cls.port), "--workers", "1"],
                                 stderr=cls.log)
        if not wait_ready("http://127.0.0.1:%d" % cls.port, cls.d,
                          seconds=120):
            cls.tearDownClass()
            raise RuntimeError("daemon not ready")
        cls.c = http.client.HTTPConnection("127.0.0.1", cls.port, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.d.terminate()
        cls.d.wait(timeout=60)
        cls.log.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def post(self, model, body):
        self.c.request("POST", "/v1/models/%s/infer" % model, body,
                       {"Content-Type": "application/json"})
        r = self.c.getresponse()
        return r.status, r.read().decode()

    def test_same_outputs(self):
        for fam, data, _ in FAMILIES:
            with open(os.path.join(DATA, data)) as f:
                lines = f.read().splitlines()[:LINES]
            for i in range(0, len(lines) - 1, 2):
                a, b = lines[i], lines[i + 1]
                dom = '{"instances": [%s, %s], "outputs": "root"}' % (a, b)
                st, ref = self.post(fam, dom)
                self.assertEqual(st, 200, ref)
                self.assertIsNotNone(outputs(ref), ref)
                for body in ('{"instances": [%s, %s]}' % (a, b),
                             ' \r\n{ "instances"\t:\n[ %s\t,%s ]\r\n} \n'
                             % (a, b)):
                    st, got = self.post(fam, body)
                    self.assertEqual(st, 200, got)
                    self.assertEqual(outputs(got), outputs(ref), body)
                # one INSTANCE alone, and in "instances"
                st, one = self.post(fam, a)
                st2, ref1 = self.post(fam, '{"instances": [%s], '
                                      '"outputs": "root"}' % a)
                self.assertEqual((st, st2), (200, 200), one + ref1)
                self.assertEqual(outputs(one), outputs(ref1), a)

    def test_same_errors(self):
        for fam, data, bad in FAMILIES:
            with open(os.path.join(DATA, data)) as f:
                a = f.readline().strip()
            for body, dom in (
                    ('{"instances": [%s, %s]}' % (a, bad),
                     '{"outputs": "root", "instances": [%s, %s]}' % (a, bad)),
                    ('{"instances": [%s, ]}' % a, None),
                    ('{"instances": [%s]} x' % a, None),
                    ('{"instances": []}', None),
                    ('{"instances": [%s], "instances": [%s]}' % (a, a), None),
                    ('{"instances": [%s' % a, None)):
                st, got = self.post(fam, body)
                self.assertGreaterEqual(st, 400, got)
                err = json.loads(got)["error"]
                self.assertIn("message", err)
                if dom is not None:
                    st2, ref = self.post(fam, dom)
                    self.assertEqual(st, st2)
                    self.assertEqual(json.loads(ref)["error"], err)
                    self.assertEqual(err.get("instance"), 1, got)


if __name__ == "__main__":
    unittest.main()
