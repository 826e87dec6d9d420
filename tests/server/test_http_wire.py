"""The HTTP layer under bytes no client library would send (CONVENTIONS.md's reliability items 3
and 5 below the JSON): malformed request lines, headers and chunked bodies, oversized headers,
pipelining, idle and drip-fed connections, the connection limit. After each, the server still
answers a valid request."""
import json
import re
import socket
import time

import pytest
import requests

from conftest import NAME, KilnServer

IDLE_TIMEOUT_S = 2
MAX_CONNECTIONS = 6


@pytest.fixture(scope="module")
def wire_server():
    s = KilnServer("--idle-timeout", str(IDLE_TIMEOUT_S), "--max-connections", str(MAX_CONNECTIONS),
                   log_name="wire")
    yield s
    s.stop()


def connect(server):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return s


def read_all(s):
    """Everything the server sends until it closes the connection."""
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return got
        got += chunk


def exchange(server, raw):
    with connect(server) as s:
        s.sendall(raw)
        return read_all(s)


def status_of(response):
    return int(response.split(b" ", 2)[1])


def body_of(response):
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


def metrics_over(sock):
    """GET /metrics on an open keep-alive connection, parsed (the model_name label dropped)."""
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    while b"\r\n\r\n" not in got:
        got += sock.recv(65536)
    head, body = got.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"Content-Length: (\d+)", head, re.I).group(1))
    while len(body) < length:
        body += sock.recv(65536)
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#") and "_bucket" not in line:
            name, value = line.rsplit(" ", 1)
            out[re.sub(r"\{.*\}", "", name)] = float(value)
    return out


def still_serves(server):
    r = requests.post(server.url + "/v1/completions", json={"model": NAME, "prompt": "Hi", "max_tokens": 2},
                      timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost x no colon\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"\x00\xff\xfe\r\n\r\n",
])
def test_malformed_http_gets_400_and_close(wire_server, raw):
    response = exchange(wire_server, raw)
    assert status_of(response) == 400, response
    assert body_of(response)["error"]["type"] == "invalid_request_error"
    still_serves(wire_server)


def test_oversized_headers_get_431(wire_server):
    raw = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"a" * 20000 + b"\r\n\r\n"
    response = exchange(wire_server, raw)
    assert status_of(response) == 431, response[:200]
    assert "8 KiB" in body_of(response)["error"]["message"]
    still_serves(wire_server)


def test_chunked_request_body_accepted(wire_server):
    body = json.dumps({"model": NAME, "prompt": "Hi", "max_tokens": 2}).encode()
    half = len(body) // 2
    raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
           + f"{half:x}\r\n".encode() + body[:half] + b"\r\n"
           + f"{len(body) - half:x}\r\n".encode() + body[half:] + b"\r\n0\r\n\r\n")
    response = exchange(wire_server, raw)
    assert status_of(response) == 200, response
    assert body_of(response)["usage"]["completion_tokens"] == 2


def test_pipelined_requests_answered_in_order(wire_server):
    raw = (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
           b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
           b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    response = exchange(wire_server, raw)
    statuses = [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", response)]
    assert statuses == [200, 200, 404], response
    assert response.index(b'"status"') < response.index(NAME.encode())


def test_http10_answered_and_closed(wire_server):
    response = exchange(wire_server, b"GET /health HTTP/1.0\r\n\r\n")
    assert response.startswith(b"HTTP/1.0 200"), response


@pytest.mark.parametrize("drip", [False, True])
def test_idle_and_drip_fed_connections_closed(wire_server, drip):
    """A connection that never completes a request is closed after --idle-timeout, whether it sends
    nothing or a byte at a time (the deadline covers the whole request, not each read)."""
    with connect(wire_server) as s:
        t0 = time.time()
        closed_after = None
        partial = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
        s.settimeout(0.25)
        for i in range(4 * IDLE_TIMEOUT_S * 4):
            try:
                if drip:
                    s.sendall(partial[i:i + 1])
                if s.recv(65536) == b"":
                    closed_after = time.time() - t0
                    break
            except socket.timeout:
                continue
            except (ConnectionResetError, BrokenPipeError):
                closed_after = time.time() - t0
                break
    assert closed_after is not None, "the connection was still open after 4x --idle-timeout"
    assert IDLE_TIMEOUT_S - 0.5 <= closed_after <= IDLE_TIMEOUT_S + 2, closed_after
    still_serves(wire_server)


def test_truncated_body_then_close(wire_server):
    """A client that announces more body than it sends and goes away loses only its request."""
    with connect(wire_server) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
    still_serves(wire_server)


def test_connection_limit_503_then_recovers(wire_server):
    held = []
    try:
        # Earlier tests' connections may take a moment to be counted closed.
        deadline = time.time() + 5
        while len(held) < MAX_CONNECTIONS and time.time() < deadline:
            s = connect(wire_server)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            head = s.recv(65536)
            if status_of(head) == 503:
                s.close()
                time.sleep(0.1)
                continue
            held.append(s)
        assert len(held) == MAX_CONNECTIONS
        rejected_before = metrics_over(held[0])["kiln:http_connections_rejected_total"]
        extra = exchange(wire_server, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(extra) == 503, extra
        assert b"Retry-After: 1" in extra and body_of(extra)["error"]["message"] == "too many connections"
        # The connections held open still work, and the metrics count them and the refusal.
        m = metrics_over(held[0])
        assert m["kiln:http_connections"] == MAX_CONNECTIONS
        assert m["kiln:http_connections_rejected_total"] == rejected_before + 1
    finally:
        for s in held:
            s.close()
    deadline = time.time() + 5
    while True:
        try:
            still_serves(wire_server)
            break
        except (AssertionError, requests.ConnectionError):
            if time.time() > deadline:
                raise
            time.sleep(0.1)
