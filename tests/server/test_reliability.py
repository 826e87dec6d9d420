"""CONVENTIONS.md's reliability checklist, items 3, 4, 5, 7, 8 (in test_openai_api.py), 11, plus
the API key, the context limit and the chat page's server side."""
import concurrent.futures as cf
import json
import signal
import socket
import threading
import time

import pytest
import requests

from conftest import NAME, KilnServer


def post(server, path, body, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(server.url + path, data=data, headers={"Content-Type": "application/json"}, timeout=30, **kw)


def assert_openai_error(r, status, param=None):
    assert r.status_code == status, (r.status_code, r.text)
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    if status == 400:
        assert e["type"] == "invalid_request_error"
    if param is not None:
        assert e["param"] == param, e
    return e


def valid_request_works(server):
    r = post(server, "/v1/completions", {"model": NAME, "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert requests.get(server.url + "/health", timeout=5).status_code == 200


# --- item 3: malformed JSON, wrong types, invalid UTF-8 -----------------------------------------

@pytest.mark.parametrize("body", [
    b"", b"{", b"not json", b"[1, 2]", b'{"prompt": "x",}', b'{"prompt": NaN}', b"\x00\x01\x02",
    b'{"prompt": "\xff\xfe bad utf-8"}', b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}',
    b'{"prompt": "\xed\xa0\x80 surrogate"}', b'{"prompt": "x", "temperature": 1e400}',
])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_malformed_bodies(server, path, body):
    assert_openai_error(post(server, path, body), 400)
    valid_request_works(server)


@pytest.mark.parametrize("body,param", [
    ({"prompt": 5}, "prompt"),
    ({"prompt": {"a": 1}}, "prompt"),
    ({"prompt": "x", "max_tokens": "10"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 1.5}, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "stop": 3}, "stop"),
    ({"prompt": "x", "stop": ["a", 1]}, "stop"),
    ({"prompt": "x", "n": True}, "n"),
    ({"prompt": "x", "seed": "s"}, "seed"),
    ({"prompt": "x", "stream_options": []}, "stream_options"),
    ({"prompt": "x", "model": 7}, "model"),
    ({"messages": "hello"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
])
def test_wrong_types(server, body, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    assert_openai_error(post(server, path, body), 400, param)
    valid_request_works(server)


def test_missing_fields_and_unknown_model(server):
    assert_openai_error(post(server, "/v1/completions", {"max_tokens": 3}), 400, "prompt")
    assert_openai_error(post(server, "/v1/chat/completions", {"max_tokens": 3}), 400, "messages")
    assert_openai_error(post(server, "/v1/completions", {"model": "gpt-9", "prompt": "x"}), 404, "model")
    assert requests.get(server.url + "/v1/nothing", timeout=5).status_code == 404
    assert requests.get(server.url + "/v1/completions", timeout=5).status_code == 405


# --- item 4: out-of-range parameters --------------------------------------------------------------

@pytest.mark.parametrize("field,value", [
    ("max_tokens", 0), ("max_tokens", -1), ("max_tokens", 2**63), ("max_tokens", 2**64 + 5), ("max_tokens", 10**9),
    ("n", 0), ("n", 10**6), ("n", -3),
    ("temperature", -1), ("temperature", 1e9), ("top_p", 0), ("top_p", 1.5), ("top_p", -0.1),
    ("top_k", -2), ("min_p", 2), ("presence_penalty", 3), ("frequency_penalty", -2.5), ("repetition_penalty", 0),
    ("logprobs", 21), ("logprobs", -1), ("stop_token_ids", [-1]), ("stop_token_ids", [49152]),
])
def test_out_of_range(server, field, value):
    t0 = time.time()
    r = post(server, "/v1/completions", {"model": NAME, "prompt": "x", field: value})
    assert_openai_error(r, 400, field)
    assert time.time() - t0 < 1.0
    valid_request_works(server)


def test_nan_temperature(server):
    # JSON has no NaN; Python's json writes the bare token, which is malformed JSON.
    r = post(server, "/v1/completions", '{"prompt": "x", "temperature": NaN}')
    assert_openai_error(r, 400)


@pytest.mark.parametrize("ids", [[-1], [49152], [1, 2, 10**12], [0.5]])
def test_bad_token_ids(server, ids):
    assert_openai_error(post(server, "/v1/completions", {"prompt": ids, "max_tokens": 2}), 400, "prompt")
    assert_openai_error(post(server, "/detokenize", {"tokens": ids}), 400, "tokens")
    valid_request_works(server)


def test_prompt_longer_than_context(small_server):
    url = small_server.url
    prompt = "hello " * 300
    n = requests.post(url + "/tokenize", json={"prompt": prompt}, headers=auth(), timeout=30).json()["count"]
    assert n > 256
    r = requests.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4}, headers=auth(), timeout=30)
    e = assert_openai_error(r, 400)
    assert str(n) in e["message"] and "256" in e["message"]
    r = requests.post(url + "/v1/completions", json={"prompt": "hi there", "max_tokens": 255}, headers=auth(),
                      timeout=30)
    e = assert_openai_error(r, 400, "max_tokens")
    assert "256" in e["message"] and "255" in e["message"]
    r = requests.post(url + "/v1/completions", json={"prompt": "hi there", "max_tokens": 254, "stop": [" ", "\n"]},
                      headers=auth(), timeout=60)
    assert r.status_code == 200


# --- item 5: body limits and overload -------------------------------------------------------------

@pytest.fixture(scope="module")
def small_server():
    s = KilnServer("--max-concurrent-requests", "3", "--max-body-bytes", "20000", "--api-key", "sekrit-key",
                   "--max-model-len", "256", log_name="small")
    yield s
    s.stop()


def auth(key="sekrit-key"):
    return {"Authorization": f"Bearer {key}"}


def test_body_too_large(small_server):
    r = requests.post(small_server.url + "/v1/completions", headers=auth(),
                      json={"prompt": "x" * 50000, "max_tokens": 2}, timeout=30)
    assert_openai_error(r, 413)
    r = requests.post(small_server.url + "/v1/completions", headers=auth(), json={"prompt": "hi", "max_tokens": 2},
                      timeout=30)
    assert r.status_code == 200


def test_overload_429_and_admitted_complete(small_server):
    def one(i):
        r = requests.post(small_server.url + "/v1/completions", headers=auth(), timeout=120,
                          json={"prompt": f"Request {i}", "max_tokens": 24, "ignore_eos": True, "temperature": 0})
        return r.status_code, r.headers.get("Retry-After"), r.json()

    with cf.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(12)))
    ok = [r for r in results if r[0] == 200]
    busy = [r for r in results if r[0] in (429, 503)]
    assert len(ok) + len(busy) == 12
    assert ok and busy
    for _, retry, body in busy:
        assert retry is not None and int(retry) >= 1 and "error" in body
    for _, _, body in ok:
        assert body["usage"]["completion_tokens"] == 24 and body["choices"][0]["finish_reason"] == "length"


def test_api_key(small_server):
    url = small_server.url + "/v1/models"
    assert_openai_error(requests.get(url, timeout=5), 401)
    assert_openai_error(requests.get(url, headers=auth("wrong"), timeout=5), 401)
    assert_openai_error(requests.get(url, headers=auth("sekrit-key-longer"), timeout=5), 401)
    assert_openai_error(requests.get(url, headers={"Authorization": "sekrit-key"}, timeout=5), 401)
    assert requests.get(url, headers=auth(), timeout=5).status_code == 200
    assert requests.get(small_server.url + "/health", timeout=5).status_code == 200  # health needs no key


# --- item 7: a client that disconnects mid-stream frees its KV blocks within a second -------------

def test_disconnect_frees_kv(server):
    def used():
        m = server.metrics()
        return m["kiln:kv_cache_blocks_used"], m["kiln:num_requests_running"] + m["kiln:num_requests_waiting"]

    baseline_free = server.metrics()["kiln:kv_cache_blocks_total"] - server.metrics()["kiln:kv_cache_blocks_used"]
    for chat in (False, True):
        body = {"model": NAME, "max_tokens": 4000, "ignore_eos": True, "stream": True}
        if chat:
            body["messages"] = [{"role": "user", "content": "Tell me a very long story."}]
        else:
            body["prompt"] = "Once upon a time " * 40
        s = socket.create_connection(("127.0.0.1", server.port))
        data = json.dumps(body).encode()
        path = "/v1/chat/completions" if chat else "/v1/completions"
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        got = b""
        while got.count(b"data: ") < 5:
            got += s.recv(65536)
        assert used()[0] > 0
        s.close()
        t0 = time.time()
        while time.time() - t0 < 1.0 and used() != (0, 0):
            time.sleep(0.02)
        assert used() == (0, 0), f"KV blocks still held {time.time() - t0:.2f} s after the disconnect"
    # A non-streamed request whose client goes away is cancelled too.
    s = socket.create_connection(("127.0.0.1", server.port))
    data = json.dumps({"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True}).encode()
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    time.sleep(0.5)
    assert used()[1] == 1
    s.close()
    t0 = time.time()
    while time.time() - t0 < 1.0 and used() != (0, 0):
        time.sleep(0.02)
    assert used() == (0, 0)
    m = server.metrics()
    assert m["kiln:kv_cache_blocks_total"] - m["kiln:kv_cache_blocks_used"] == baseline_free


# --- item 11: SIGTERM drains ----------------------------------------------------------------------

def test_sigterm_drains():
    s = KilnServer(log_name="drain")
    result = {}

    def stream():
        r = requests.post(s.url + "/v1/completions", stream=True, timeout=120, json={
            "prompt": "Once upon a time", "max_tokens": 60, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}})
        result["lines"] = [l for l in r.iter_lines() if l.startswith(b"data: ")]

    t = threading.Thread(target=stream)
    t.start()
    # Wait until the stream is running, then ask the server to stop.
    t0 = time.time()
    while s.metrics()["kiln:num_requests_running"] < 1 and time.time() - t0 < 10:
        time.sleep(0.02)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    r = requests.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
    assert_openai_error(r, 503)
    assert r.headers.get("Retry-After")
    assert requests.get(s.url + "/health", timeout=5).status_code == 503
    t.join(60)
    assert s.proc.wait(30) == 0
    lines = result["lines"]
    assert lines[-1] == b"data: [DONE]"
    usage = json.loads(lines[-2][6:])["usage"]
    assert usage["completion_tokens"] == 60
    s.stop()


def test_health_503_while_loading_is_reported(server):
    # The server listens before the model loads; a ready one says ok.
    assert requests.get(server.url + "/health", timeout=5).json()["status"] == "ok"


def test_chat_page_served(server):
    r = requests.get(server.url + "/", timeout=5)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/v1/chat/completions" in r.text and "tokens/s" in r.text
