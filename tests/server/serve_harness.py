"""Helpers for tests/server/test_server.py: starting `nibble serve` on a free loopback port and talking
to it over raw HTTP (requests, Server-Sent Event streams, Prometheus metrics). Standard library only."""
import http.client
import json
import re
import subprocess
import tempfile
import time

MODEL = "tests/fixtures/tiny-mixtral"
SERVED_NAME = "tiny-mixtral"
NIBBLE = None
API_KEY = None  # sent with every request when set
SERVER = None  # the running Server


class Server:
    def __init__(self, nibble, flags):
        self.log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a full pipe would block it
        self.proc = subprocess.Popen(
            [nibble, "serve", "--model-path", MODEL, "--device", "cpu", "--port", "0",
             "--served-model-name", SERVED_NAME, *flags],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()  # "nibble: serving NAME at http://HOST:PORT"
        match = re.search(r"http://([\d.]+):(\d+)", line)
        if not match:
            self.proc.kill()
            self.proc.wait()
            self.log.seek(0)
            raise RuntimeError(f"server did not start: {line!r} {self.log.read()}")
        self.url = match.group(0)
        self.host, self.port = match.group(1), int(match.group(2))
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if request("GET", "/health", server=self)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server never became healthy")

    def stop(self):
        self.proc.send_signal(2)  # SIGINT: must shut down cleanly
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return code


def headers(extra=None, key="default"):
    h = {"Content-Type": "application/json"}
    key = API_KEY if key == "default" else key
    if key:
        h["Authorization"] = f"Bearer {key}"
    h.update(extra or {})
    return h


def request(method, path, body=None, key="default", server=None, timeout=60):
    """Returns (status, parsed JSON or text)."""
    s = server or SERVER
    conn = http.client.HTTPConnection(s.host, s.port, timeout=timeout)
    data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
    conn.request(method, path, body=data, headers=headers(key=key))
    resp = conn.getresponse()
    raw = resp.read().decode("utf-8", errors="replace")
    conn.close()
    try:
        return resp.status, json.loads(raw)
    except json.JSONDecodeError:
        return resp.status, raw


def stream(path, body):
    """A streamed request over raw HTTP: returns the parsed events (without [DONE]) and whether
    [DONE] came last."""
    conn = http.client.HTTPConnection(SERVER.host, SERVER.port, timeout=120)
    conn.request("POST", path, body=json.dumps({**body, "stream": True}), headers=headers())
    resp = conn.getresponse()
    assert resp.status == 200, (resp.status, resp.read())
    assert resp.getheader("Content-Type").startswith("text/event-stream")
    events, done = [], False
    for raw in resp:
        line = raw.decode().rstrip("\n")
        if not line.startswith("data: "):
            assert line == "" or line.startswith(":"), line  # blank separators and keep-alive comments
            continue
        assert not done, "data after [DONE]"
        if line == "data: [DONE]":
            done = True
        else:
            events.append(json.loads(line[6:]))
    conn.close()
    return events, done


def metrics():
    status, text = request("GET", "/metrics")
    assert status == 200
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def wait_for_kv_blocks_free(test, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = metrics()
        if m["nibble_kv_blocks_used"] == 0 and m["nibble_num_requests_running"] == 0:
            return
        time.sleep(0.05)
    test.fail(f"KV blocks still in use: {metrics()['nibble_kv_blocks_used']}")


def token_count(text, special=True):
    args = [NIBBLE, "tokenize", "--model-path", MODEL, "--text", text]
    if not special:
        args.append("--no-special-tokens")
    return len(json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout))


def chatml(messages):
    # The fixture has no chat template, so the server falls back to ChatML.
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + "<|im_start|>assistant\n"
