#!/usr/bin/python3
"""canopy_client.py - a small client for `canopy serve` (standard library only).

As a library:
    from canopy_client import Client
    c = Client("http://127.0.0.1:8080")
    c.models()                                   # GET /v1/models
    c.infer("treelstm", [{"tree": "(3 (2 It) (4 (2 is) (2 fine)))"}])

As a CLI: sends a JSONL file of INSTANCE objects (API.md) in batches and
prints one output object a line, in input order (like `canopy run`):
    canopy_client.py --model treelstm --input data.jsonl [--batch 32]
"""
import argparse
import http.client
import json
import sys
import urllib.parse


class CanopyError(Exception):
    """An error answer: status, the API.md error object, and the request id."""

    def __init__(self, status, error, request_id):
        self.status, self.error, self.request_id = status, error, request_id
        super().__init__("%d %s: %s (request %s)" % (
            status, error.get("code"), error.get("message"), request_id))


class Client:
    """One keep-alive HTTP/1.1 connection to the daemon."""

    def __init__(self, url="http://127.0.0.1:8080", timeout=60.0):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.timeout = timeout
        self.conn = None

    def _request(self, method, path, body=None, request_id=None):
        headers = {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if request_id:
            headers["X-Request-Id"] = request_id
        for attempt in (0, 1):  # one retry on a connection closed by the peer
            if self.conn is None:
                self.conn = http.client.HTTPConnection(
                    self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                raw = resp.read()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError,
                    BrokenPipeError):
                self.close()
                if attempt:
                    raise
        rid = resp.getheader("X-Request-Id")
        ctype = resp.getheader("Content-Type", "")
        payload = json.loads(raw) if ctype.startswith("application/json") \
            else raw.decode()
        if resp.status >= 400:
            err = payload.get("error", {}) if isinstance(payload, dict) else {}
            raise CanopyError(resp.status, err, rid)
        return payload

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def models(self):
        return self._request("GET", "/v1/models")["models"]

    def model(self, name):
        return self._request("GET", "/v1/models/" + urllib.parse.quote(name))

    def ready(self):
        try:
            self._request("GET", "/readyz")
            return True
        except CanopyError:
            return False

    def metrics(self):
        return self._request("GET", "/metrics")

    def infer(self, model, instances, outputs="root", return_hidden=False,
              timeout_ms=None, request_id=None):
        """Returns the whole answer: {"model", "outputs", "stats"}."""
        body = {"instances": instances, "outputs": outputs,
                "return_hidden": return_hidden}
        if timeout_ms:
            body["timeout_ms"] = timeout_ms
        path = "/v1/models/%s/infer" % urllib.parse.quote(model)
        return self._request("POST", path, body, request_id)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True, help="JSONL file, '-' = stdin")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--outputs", choices=["root", "all"], default="root")
    ap.add_argument("--return-hidden", action="store_true")
    ap.add_argument("--timeout-ms", type=int)
    a = ap.parse_args()
    f = sys.stdin if a.input == "-" else open(a.input)
    lines = [json.loads(l) for l in f if l.strip()]
    c = Client(a.url)
    status, stats = 0, {"requests": 0, "batches": 0, "lower_bound": 0}
    for i in range(0, len(lines), a.batch):
        chunk = lines[i:i + a.batch]
        try:
            ans = c.infer(a.model, chunk, a.outputs, a.return_hidden,
                          a.timeout_ms)
        except CanopyError as e:
            print(json.dumps({"error": e.error}))
            print("canopy_client: lines %d-%d: %s" % (
                i + 1, i + len(chunk), e), file=sys.stderr)
            status = 2
            continue
        for out in ans["outputs"]:
            print(json.dumps(out, separators=(",", ":")))
        stats["requests"] += 1
        stats["batches"] += ans["stats"]["batches"]
        stats["lower_bound"] += ans["stats"]["lower_bound"]
    print(json.dumps(stats), file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
