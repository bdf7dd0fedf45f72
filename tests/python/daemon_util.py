"""What the Python tests share about a daemon they start: a free port on
loopback, and waiting until it answers /readyz."""
import socket
import time
import urllib.request


def free_port():
    """A port nothing listens on now (the daemon binds it next)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_ready(url, proc=None, seconds=10.0):
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
