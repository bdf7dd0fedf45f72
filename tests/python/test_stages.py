"""Stage times: `canopy run`'s summary (parse_s, schedule_s, execute_s,
output_s) and the daemon's canopy_stage_seconds_total{model,stage} and
canopy_http_seconds_total in /metrics. Each stage is CPU time of the
threads that did it, so after real work each is above zero and together
they are no more than the process's CPU time (getrusage of the child, or
/proc/PID/stat of the daemon), up to the clocks' granularity. No
wall-clock assertion: the daemon is waited on through its own answers.

Run: /usr/bin/python3 -m unittest discover -s tests/python -p test_stages.py
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

STAGES = ("parse_s", "schedule_s", "execute_s", "output_s")
FAMILIES = [("treelstm", "trees-binary.jsonl", []),
            ("latticelstm", "lattices.jsonl",
             ["--lexicon", os.path.join(DATA, "lexicon.txt")]),
            ("bilstm-tagger", "sequences.jsonl", [])]


def init_model(tmp, fam, data, extra):
    path = os.path.join(tmp, fam)
    subprocess.run([BIN, "model", "init", fam, path, "--hidden", "8",
                    "--embed", "8", "--classes", "5", "--vocab-from",
                    os.path.join(DATA, data)] + extra, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


class RunSummary(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="canopy-stages-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_canopy(self, model, data, jobs):
        p = subprocess.Popen([BIN, "run", "--model", model, "--input",
                              os.path.join(DATA, data), "--jobs", str(jobs),
                              "--batch", "64", "--threads", "1"],
                             stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        err = p.stderr.read().decode()
        p.stderr.close()
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        self.assertEqual(p.returncode, 0, err)
        return json.loads(err.strip().splitlines()[-1]), \
            ru.ru_utime + ru.ru_stime

    def test_stages_within_cpu(self):
        for fam, data, extra in FAMILIES:
            model = init_model(self.tmp, fam, data, extra)
            for jobs in (1, 2):
                with self.subTest(family=fam, jobs=jobs):
                    s, cpu = self.run_canopy(model, data, jobs)
                    for k in STAGES:
                        self.assertIn(k, s)
                        self.assertGreater(s[k], 0, k)
                    total = sum(s[k] for k in STAGES)
                    # CPU clocks of threads within the process's: at most
                    # its time, up to a scheduler tick of rounding
                    self.assertLessEqual(total, cpu * 1.01 + 0.005,
                                         "stages %s, process CPU %.6f" %
                                         ({k: s[k] for k in STAGES}, cpu))


def proc_cpu(pid):
    """utime + stime of a process in seconds (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


class DaemonMetrics(unittest.TestCase):
    def test_stage_counters(self):
        tmp = tempfile.mkdtemp(prefix="canopy-stages-d-")
        log = open(os.path.join(tmp, "log"), "w+")
        models = os.path.join(tmp, "models")
        os.mkdir(models)
        init_model(models, "treelstm", "trees-binary.jsonl", [])
        port = free_port()
        d = subprocess.Popen([BIN, "serve", "--models-dir", models, "--port",
                              str(port), "--workers", "1"], stderr=log)
        try:
            self.assertTrue(wait_ready("http://127.0.0.1:%d" % port, d,
                                       seconds=60), "daemon not ready")
            with open(os.path.join(DATA, "trees-binary.jsonl")) as f:
                lines = f.read().splitlines()[:200]
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            for line in lines:
                c.request("POST", "/v1/models/treelstm/infer", line,
                          {"Content-Type": "application/json"})
                r = c.getresponse()
                body = r.read()
                self.assertEqual(r.status, 200, body)
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
            c.close()
            cpu = proc_cpu(d.pid)
            got = dict(re.findall(
                r'^canopy_stage_seconds_total\{model="treelstm",'
                r'stage="(\w+)"\} ([0-9.e+-]+)$', text, re.M))
            self.assertEqual(sorted(got), sorted(k[:-2] for k in STAGES),
                             text)
            for k, v in got.items():
                self.assertGreater(float(v), 0, k)
            m = re.search(r"^canopy_http_seconds_total ([0-9.e+-]+)$", text,
                          re.M)
            self.assertIsNotNone(m, text)
            http_s = float(m.group(1))
            self.assertGreater(http_s, 0)
            total = sum(float(v) for v in got.values()) + http_s
            # /proc counts in clock ticks: a tick of slack per thread
            self.assertLessEqual(total, cpu * 1.01 + 0.05,
                                 "stages %s + http %.6f, daemon CPU %.2f" %
                                 (got, http_s, cpu))
        finally:
            d.terminate()
            d.wait(timeout=60)
            log.close()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
