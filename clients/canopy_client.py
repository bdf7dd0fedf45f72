#!/usr/bin/python3
"""canopy_client.py - a small client for `canopy serve` (standard library only).

As a library:
    from canopy_client import Client
    c = Client("http://127.0.0.1:8080")
    c.models()                                   # GET /v1/models
    c.infer("treelstm", [{"tree": "(3 (2 It) (4 (2 is) (2 fine)))"}])

As a CLI: sends a JSONL file of INSTANCE objects (docs/api.md) in batches
and prints exactly one output line per input line, in input order (like
`canopy run`): the output object, or {"error": ...} for a line that failed.
A batch the daemon refuses because of one bad instance is resent one line
at a time, so the good lines still get their outputs. 429 and 503 are
retried after Retry-After (--retries times). Exit status: 0 all lines
answered, 2 some lines failed, 3 the daemon could not be reached.
    canopy_client.py --model treelstm --input data.jsonl [--batch 32]
The daemon's address is --url, else $CANOPY_URL, else
http://127.0.0.1:8080.
"""
import argparse
import http.client
import json
import math
import os
import socket
import sys
import time
import urllib.parse


class CanopyError(Exception):
    """An error answer: status, the docs/api.md error object, and the request id."""

    def __init__(self, status, error, request_id):
        self.status, self.error, self.request_id = status, error, request_id
        self.retry_after = 0.0
        super().__init__("%d %s: %s (request %s)" % (
            status, error.get("code"), error.get("message"), request_id))


class Unreachable(Exception):
    """The daemon could not be reached (refused, reset, timed out)."""


class Client:
    """One keep-alive HTTP/1.1 connection to the daemon. 429 and 503
    answers are retried after their Retry-After (at most `retries` times,
    each wait capped at `max_wait_s`) before they are raised."""

    def __init__(self, url="http://127.0.0.1:8080", timeout=60.0, retries=5,
                 max_wait_s=30.0):
        u = urllib.parse.urlparse(url)
        self.url = url
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.timeout = timeout
        self.retries, self.max_wait_s = retries, max_wait_s
        self.conn = None

    def _request(self, method, path, body=None, request_id=None):
        for attempt in range(self.retries + 1):
            try:
                return self._request_once(method, path, body, request_id)
            except CanopyError as e:
                if e.status not in (429, 503) or attempt == self.retries:
                    raise
                time.sleep(min(max(e.retry_after, 0.05), self.max_wait_s))

    def _request_once(self, method, path, body=None, request_id=None):
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
                    BrokenPipeError) as e:
                self.close()
                if attempt:
                    raise Unreachable("%s: %s" % (self.url, e)) from None
            except (ConnectionRefusedError, socket.timeout, OSError) as e:
                self.close()
                raise Unreachable("%s: %s" % (self.url, e)) from None
        if resp.getheader("Connection", "").lower() == "close":
            self.close()  # draining: the next request needs a new one
        rid = resp.getheader("X-Request-Id")
        ctype = resp.getheader("Content-Type", "")
        payload = json.loads(raw) if ctype.startswith("application/json") \
            else raw.decode()
        if resp.status >= 400:
            err = payload.get("error", {}) if isinstance(payload, dict) else {}
            e = CanopyError(resp.status, err, rid)
            e.retry_after = _retry_after(resp.getheader("Retry-After"))
            raise e
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


def _retry_after(value):
    """Seconds from a Retry-After header: 1 when it is absent or is not a
    finite number of seconds (an HTTP date, "nan" from some other server),
    as if it were absent."""
    try:
        secs = float(value)
    except (TypeError, ValueError):
        return 1.0
    return secs if math.isfinite(secs) else 1.0


def _error_line(code, message, **where):
    err = {"code": code, "message": message}
    err.update(where)
    return {"error": err}


def run_file(c, a, lines, out=sys.stdout, log=sys.stderr):
    """Sends the parsed lines in batches; writes one output line per input
    line. lines: list of (line number, instance or None, parse error).
    Returns (exit status, stats)."""
    status, stats = 0, {"requests": 0, "batches": 0, "lower_bound": 0,
                        "lines": len(lines), "errors": 0}
    results = {}

    def fail(no, err, why):
        results[no] = err
        stats["errors"] += 1
        print("canopy_client: line %d: %s" % (no, why), file=log)

    def send(chunk):
        ans = c.infer(a.model, [inst for _, inst, _ in chunk], a.outputs,
                      a.return_hidden, a.timeout_ms)
        stats["requests"] += 1
        stats["batches"] += ans["stats"]["batches"]
        stats["lower_bound"] += ans["stats"]["lower_bound"]
        for (no, _, _), o in zip(chunk, ans["outputs"]):
            results[no] = o

    good = []
    for no, inst, perr in lines:
        if inst is None:
            fail(no, _error_line("bad_json", perr, line=no), perr)
        else:
            good.append((no, inst, None))
    unreachable = None
    for i in range(0, len(good), a.batch):
        chunk = good[i:i + a.batch]
        if unreachable is None:
            try:
                send(chunk)
                continue
            except Unreachable as e:
                unreachable = str(e)
            except CanopyError as e:
                if len(chunk) == 1 or e.status not in (400, 413):
                    for no, _, _ in chunk:
                        err = dict(e.error)
                        err.pop("instance", None)
                        fail(no, {"error": err}, e)
                    continue
                # one bad instance fails its whole request: resend the
                # batch a line at a time so the others get their outputs
                for one in chunk:
                    try:
                        send([one])
                    except CanopyError as e1:
                        err = dict(e1.error)
                        err.pop("instance", None)
                        fail(one[0], {"error": err}, e1)
                    except Unreachable as e1:
                        unreachable = str(e1)
                        break
                if unreachable is None:
                    continue
        for no, _, _ in chunk:
            if no not in results:
                results[no] = _error_line("unavailable", "the daemon could "
                                          "not be reached: " + unreachable)
                stats["errors"] += 1
    for no, _, _ in lines:
        print(json.dumps(results[no], separators=(",", ":")), file=out)
    if unreachable is not None:
        print("canopy_client: cannot reach the daemon at %s (%s); is "
              "`canopy serve` running?" % (a.url, unreachable), file=log)
        status = 3
    elif stats["errors"]:
        status = 2
    return status, stats


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # the daemon's address: --url, else $CANOPY_URL (as curl-examples.sh
    # and the demo's banner use it), else the daemon's default address
    ap.add_argument("--url", default=os.environ.get("CANOPY_URL") or
                    "http://127.0.0.1:8080",
                    help="the daemon; $CANOPY_URL when set")
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True, help="JSONL file, '-' = stdin")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--outputs", choices=["root", "all"], default="root")
    ap.add_argument("--return-hidden", action="store_true")
    ap.add_argument("--timeout-ms", type=int)
    ap.add_argument("--retries", type=int, default=5,
                    help="retries of a 429/503 answer after its Retry-After")
    a = ap.parse_args()
    if a.batch < 1:
        ap.error("--batch must be at least 1")
    try:
        # bytes: a line that is not UTF-8 is one bad line, not a crash
        f = sys.stdin.buffer if a.input == "-" else open(a.input, "rb")
    except OSError as e:
        print("canopy_client: %s" % e, file=sys.stderr)
        return 2
    lines = []
    with f:
        for no, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                lines.append((no, None, "not valid UTF-8: byte %d of the line"
                              % (e.start + 1)))
                continue
            if not text.strip():  # as `canopy run`: an error line
                lines.append((no, None, "line %d is empty" % no))
                continue
            try:
                lines.append((no, json.loads(text), None))
            except ValueError as e:
                lines.append((no, None, "not valid JSON: %s" % e))
    c = Client(a.url, retries=a.retries)
    status, stats = run_file(c, a, lines)
    print(json.dumps(stats), file=sys.stderr)
    return status


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
