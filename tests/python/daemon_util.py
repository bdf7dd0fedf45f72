"""What the Python tests share about a daemon they start: a free port on
loopback, waiting until it answers /readyz, and waiting for any other
event it shows (never for a fixed time)."""
import socket
import time
import urllib.request

# How long a wait for an event may take before the test fails: a guard
# against a hang, not a timing (a busy machine or a sanitizer build is
# slow, never wrong).
DEADLINE_S = 60.0


def free_port():
    """A port nothing listens on now (the daemon binds it next)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_until(probe, ok=bool, seconds=DEADLINE_S):
    """Calls probe() every 10 ms until ok(its value) holds or seconds pass;
    returns the last value (the caller asserts on it)."""
    end = time.monotonic() + seconds
    while True:
        v = probe()
        if ok(v) or time.monotonic() >= end:
            return v
        time.sleep(0.01)


def wait_ready(url, proc=None, seconds=DEADLINE_S):
    """Polls url + "/readyz" until it answers 200; False if it never did
    within seconds or proc (the daemon, a Popen) exited first."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            urllib.request.urlopen(url + "/readyz", timeout=1)
            return True
        except OSError:
            time.sleep(0.02)
    return False
