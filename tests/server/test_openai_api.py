"""The OpenAI API as the official `openai` client sees it: chat and completions, streaming and
not, stop strings, max_tokens, usage, logprobs, n, seeds, and 32 concurrent streams."""
import concurrent.futures as cf

import pytest
import requests

from conftest import NAME

CHAT = [{"role": "user", "content": "Write one sentence about the sea."}]


def tokenize(server, **body):
    r = requests.post(server.url + "/tokenize", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_models(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [NAME]
    raw = requests.get(server.url + "/v1/models", timeout=5).json()
    card = raw["data"][0]
    assert raw["object"] == "list" and card["object"] == "model"
    assert card["root"].endswith(".gguf") and card["max_model_len"] == 8192 and card["owned_by"] == "kiln"


def test_health_and_metrics(server):
    assert requests.get(server.url + "/health", timeout=5).json() == {"status": "ok"}
    m = server.metrics()
    for name in ["kiln:num_requests_running", "kiln:num_requests_waiting", "kiln:kv_cache_usage_perc",
                 "kiln:prompt_tokens_total", "kiln:generation_tokens_total", "kiln:num_preemptions_total",
                 "kiln:time_to_first_token_seconds_count", "kiln:inter_token_latency_seconds_count",
                 "kiln:e2e_request_latency_seconds_count", "kiln:request_queue_time_seconds_count",
                 "process_resident_memory_bytes", "kiln:achieved_bandwidth_gbs", "kiln:model_bytes_moved_total",
                 "kiln:engine_busy_seconds_total"]:
        assert name in m, name


def test_bandwidth_metrics_grow_with_work(client, server):
    before = server.metrics()["kiln:model_bytes_moved_total"]
    client.completions.create(model=NAME, prompt="The kiln", max_tokens=4, temperature=0)
    after = server.metrics()
    # Each step moves at least the weights once (fp32 on the CPU backend: 4 bytes a parameter).
    assert after["kiln:model_bytes_moved_total"] - before >= 4 * 4 * 134e6
    assert after["kiln:achieved_bandwidth_gbs"] > 0


def test_chat(client, server):
    r = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=24, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    prompt = tokenize(server, messages=CHAT)
    assert r.usage.prompt_tokens == prompt["count"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert 1 <= r.usage.completion_tokens <= 24


def test_chat_stream(client):
    stream = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text


def test_completions(client, server):
    prompt = "The capital of France is"
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.choices[0].text
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == tokenize(server, prompt=prompt)["count"]
    assert r.usage.completion_tokens == 8


def test_completions_token_prompt(client, server):
    ids = tokenize(server, prompt="Once upon a time")["tokens"]
    a = client.completions.create(model=NAME, prompt=ids, max_tokens=8, temperature=0)
    b = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    assert a.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("chat", [False, True])
def test_max_tokens_and_usage(client, chat):
    for n in (1, 5, 17):
        if chat:
            r = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=n, temperature=0,
                                               logprobs=True, extra_body={"ignore_eos": True})
            got = len(r.choices[0].logprobs.content)
        else:
            r = client.completions.create(model=NAME, prompt="Hello", max_tokens=n, temperature=0, logprobs=0,
                                          extra_body={"ignore_eos": True})
            got = len(r.choices[0].logprobs.tokens)
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == n == got


def test_completion_tokens_match_detokenized_ids(client, server):
    """completion_tokens counts exactly the generated ids: their detokenized text is the answer."""
    r = requests.post(server.url + "/v1/completions", json={
        "model": NAME, "prompt": "List three colors:", "max_tokens": 20, "temperature": 0, "logprobs": 0,
        "ignore_eos": True}, timeout=60).json()
    pieces = r["choices"][0]["logprobs"]["tokens"]
    assert len(pieces) == r["usage"]["completion_tokens"] == 20
    ids = tokenize(server, prompt=r["choices"][0]["text"], add_special_tokens=False)["tokens"]
    text = requests.post(server.url + "/detokenize", json={"tokens": ids}, timeout=5).json()["prompt"]
    assert text == r["choices"][0]["text"]


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings(client, stream):
    base = client.completions.create(model=NAME, prompt="Count: 1, 2, 3,", max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    # A stop string from the middle of the greedy answer, spanning several tokens.
    stop = base[len(base) // 3: len(base) // 3 + 4]
    assert stop.strip() and stop in base
    expected = base[: base.index(stop)]
    if stream:
        chunks = list(client.completions.create(model=NAME, prompt="Count: 1, 2, 3,", max_tokens=24,
                                                temperature=0, stop=[stop, "never-seen-stop"], stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        r = client.completions.create(model=NAME, prompt="Count: 1, 2, 3,", max_tokens=24, temperature=0,
                                      stop=[stop, "never-seen-stop"])
        text, finish = r.choices[0].text, [r.choices[0].finish_reason]
    assert text == expected
    assert finish == ["stop"]


def test_stop_string_included(client):
    base = client.completions.create(model=NAME, prompt="Count: 1, 2, 3,", max_tokens=16, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base[4:7]
    r = client.completions.create(model=NAME, prompt="Count: 1, 2, 3,", max_tokens=16, temperature=0, stop=stop,
                                  extra_body={"include_stop_str_in_output": True})
    assert r.choices[0].text == base[: base.index(stop) + len(stop)]


def test_n_and_seed(client):
    kw = dict(model=NAME, prompt="My favourite animal is", max_tokens=12, temperature=1.0, n=3, seed=1234)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1  # distinct samples per choice
    assert a.usage.completion_tokens == sum(
        len(c.logprobs.tokens) if c.logprobs else 0 for c in a.choices) or a.usage.completion_tokens > 0


def test_n_stream(client):
    chunks = list(client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=8, n=2, seed=7, stream=True))
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_logprobs(client):
    r = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=3)
    for item in r.choices[0].logprobs.content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        # Greedy: the sampled token is the most likely one.
        assert abs(item.top_logprobs[0].logprob - item.logprob) < 1e-4
    c = client.completions.create(model=NAME, prompt="Hello", max_tokens=4, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(t) <= 2 for t in lp.top_logprobs)


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("prompt", ["Tell me about the ocean.", "日本の首都はどこですか？絵文字で答えて 🌊🐟",
                                    "Écris une phrase en français avec des accents: é, è, à, ç."])
def test_stream_equals_nonstream(client, chat, prompt):
    """Reliability item 8: streamed deltas concatenate to the non-streamed text, byte for byte,
    multi-byte characters split across tokens included (temperature 0)."""
    kw = dict(model=NAME, max_tokens=48, temperature=0)
    if chat:
        msgs = [{"role": "user", "content": prompt}]
        full = client.chat.completions.create(messages=msgs, **kw).choices[0].message.content
        parts = [c.choices[0].delta.content or "" for c in
                 client.chat.completions.create(messages=msgs, stream=True, **kw) if c.choices]
    else:
        full = client.completions.create(prompt=prompt, **kw).choices[0].text
        parts = [c.choices[0].text for c in client.completions.create(prompt=prompt, stream=True, **kw)
                 if c.choices]
    assert "".join(parts).encode() == full.encode()
    # Only a character cut off by max_tokens may end as U+FFFD (as in vLLM); none inside.
    assert "\ufffd" not in full[:-1]


def test_multibyte_output_never_split(server):
    """Raw SSE bytes: every data line is valid UTF-8 JSON even when a character spans tokens."""
    r = requests.post(server.url + "/v1/completions", stream=True, timeout=60, json={
        "model": NAME, "prompt": "絵文字: 🌊🐟🐠🐙 日本語: 東京、大阪、京都、", "max_tokens": 40, "temperature": 0,
        "stream": True, "ignore_eos": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    texts = []
    for line in r.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            import json
            j = json.loads(line[6:].decode("utf-8", errors="strict"))
            texts.extend(c["text"] for c in j["choices"])
    assert any(ord(ch) > 0x7F for t in texts for ch in t)


def test_32_concurrent_streams(client):
    def one(i):
        stream = client.completions.create(model=NAME, prompt=f"Story number {i}:", max_tokens=16, temperature=0.8,
                                           seed=i, stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True})
        chunks = list(stream)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        return finish, chunks[-1].usage.completion_tokens

    with cf.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(32)))
    assert results == [(["length"], 16)] * 32


def test_tokenize_detokenize(server):
    t = tokenize(server, prompt="Hello world")
    assert t["count"] == len(t["tokens"]) and t["max_model_len"] == 8192
    d = requests.post(server.url + "/detokenize", json={"tokens": t["tokens"]}, timeout=5).json()
    assert d["prompt"].endswith("Hello world")
