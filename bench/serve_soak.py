#!/usr/bin/env python3
"""Soak test for a running kiln server (CONVENTIONS.md reliability item 12).

For a bounded time, N workers send a mix of requests: valid ones (chat and completions, streamed
or not), streams cancelled at a random point (the client closes the connection), and ~1% bad
requests (malformed JSON, out-of-range fields). At the end it checks: zero errors on valid
requests, every bad request refused with a 4xx, the engine idle again with its KV blocks all free,
and the server's resident memory back near its baseline. Exits 1 when a check fails.

    python3 bench/serve_soak.py --base-url http://127.0.0.1:8000 --duration 600 --concurrency 16
"""
import argparse
import http.client
import json
import random
import re
import sys
import threading
import time
import urllib.parse


def metrics(host, port):
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "_bucket" not in line:
            name, value = line.rsplit(" ", 1)
            out[re.sub(r"\{.*\}", "", name)] = float(value)
    return out


BAD = [
    b"{", b"not json", b'{"prompt": "\xff\xfe"}', b'{"prompt": "x", "max_tokens": -1}',
    b'{"prompt": "x", "max_tokens": 9223372036854775808}', b'{"prompt": "x", "n": 1000000}',
    b'{"prompt": "x", "temperature": -1}', b'{"prompt": "x", "top_p": 1.5}', b'{"prompt": [-1]}',
    b'{"prompt": [99999999]}', b'{"messages": "x"}', b'{"prompt": 5}',
]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {"valid_ok": 0, "valid_error": 0, "cancelled": 0, "bad_rejected": 0, "bad_accepted": 0}
        self.errors = []

    def add(self, key, err=None):
        with self.lock:
            self.counts[key] += 1
            if err and len(self.errors) < 20:
                self.errors.append(err)


def request(host, port, path, body, headers):
    c = http.client.HTTPConnection(host, port, timeout=300)
    c.request("POST", path, body=body, headers=headers)
    return c, c.getresponse()


def worker(args, host, port, headers, stats, deadline, rng, model):
    while time.time() < deadline:
        roll = rng.random()
        chat = rng.random() < 0.5
        path = "/v1/chat/completions" if chat else "/v1/completions"
        if roll < args.bad_fraction:
            c, r = request(host, port, path, rng.choice(BAD), headers)
            body = r.read()
            c.close()
            ok = 400 <= r.status < 500 and b'"error"' in body
            stats.add("bad_rejected" if ok else "bad_accepted", None if ok else f"bad request got {r.status}")
            continue
        max_tokens = rng.randint(1, args.max_tokens)
        body = {"model": model, "max_tokens": max_tokens, "temperature": rng.choice([0, 0.7, 1.0]),
                "seed": rng.randrange(1 << 31), "ignore_eos": True}
        text = " ".join(rng.choice(["kiln", "fire", "clay", "glaze", "pot", "heat", "ash", "stone"])
                        for _ in range(rng.randint(1, args.max_prompt_words)))
        if chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        cancel = roll < args.bad_fraction + args.cancel_fraction
        stream = cancel or rng.random() < 0.5
        body["stream"] = stream
        if stream:
            body["stream_options"] = {"include_usage": True}
        try:
            c, r = request(host, port, path, json.dumps(body), headers)
            if r.status != 200:
                stats.add("valid_error", f"HTTP {r.status}: {r.read()[:200]!r}")
                c.close()
                continue
            if cancel:
                stop_after = rng.randint(1, 8)
                seen = 0
                while seen < stop_after:
                    line = r.readline()
                    if not line or line.strip() == b"data: [DONE]":
                        break
                    seen += line.startswith(b"data: ")
                c.close()  # the client goes away mid-stream
                stats.add("cancelled")
                continue
            if stream:
                usage, finish = None, None
                for line in iter(r.readline, b""):
                    line = line.strip()
                    if line == b"data: [DONE]":
                        break
                    if line.startswith(b"data: "):
                        j = json.loads(line[6:])
                        if "error" in j:
                            raise RuntimeError(j["error"]["message"])
                        usage = j.get("usage") or usage
                        for ch in j.get("choices", []):
                            finish = ch.get("finish_reason") or finish
            else:
                j = json.loads(r.read())
                usage, finish = j["usage"], j["choices"][0]["finish_reason"]
            c.close()
            if finish != "length" or not usage or usage["completion_tokens"] != max_tokens:
                stats.add("valid_error", f"finish {finish}, usage {usage}, wanted {max_tokens} tokens")
            else:
                stats.add("valid_ok")
        except Exception as e:  # noqa: BLE001
            stats.add("valid_error", repr(e))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--api-key")
    p.add_argument("--duration", type=float, default=600, help="seconds (bounded)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--cancel-fraction", type=float, default=0.1)
    p.add_argument("--bad-fraction", type=float, default=0.01)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-prompt-words", type=int, default=200)
    p.add_argument("--rss-tolerance-mb", type=float, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="save the result")
    args = p.parse_args()
    u = urllib.parse.urlparse(args.base_url)
    host, port = u.hostname, u.port or 80
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/v1/models", headers=headers)
    model = json.loads(c.getresponse().read())["data"][0]["id"]
    c.close()

    # Warm up (allocator pools, first-use buffers), then take the baseline.
    c, r = request(host, port, "/v1/completions", json.dumps({"prompt": "warm up", "max_tokens": 8}), headers)
    r.read()
    c.close()
    # The baseline is the idle server: wait until the warm-up has left the engine.
    t_idle = time.time()
    base = metrics(host, port)
    while time.time() - t_idle < 10 and (base["kiln:num_requests_running"] or base["kiln:num_requests_waiting"] or
                                         base["kiln:kv_cache_blocks_used"]):
        time.sleep(0.1)
        base = metrics(host, port)
    print(f"soak: {args.duration:.0f} s, {args.concurrency} workers, baseline RSS "
          f"{base['process_resident_memory_bytes'] / 2**20:.1f} MiB, KV blocks used {base['kiln:kv_cache_blocks_used']:.0f}"
          f" of {base['kiln:kv_cache_blocks_total']:.0f}", flush=True)
    stats = Stats()
    deadline = time.time() + args.duration
    threads = [threading.Thread(target=worker, args=(args, host, port, headers, stats, deadline,
                                                     random.Random(args.seed * 1000 + i), model), daemon=True)
               for i in range(args.concurrency)]
    t0 = time.time()
    for t in threads:
        t.start()
    peak_rss = 0.0
    last_print = 0.0
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        m = metrics(host, port)
        peak_rss = max(peak_rss, m["process_resident_memory_bytes"])
        if time.time() - last_print < 10:
            continue
        last_print = time.time()
        print(f"  t={time.time() - t0:6.0f}s {stats.counts} running {m['kiln:num_requests_running']:.0f} "
              f"KV {m['kiln:kv_cache_usage_perc'] * 100:.0f}% RSS {m['process_resident_memory_bytes'] / 2**20:.1f} MiB",
              flush=True)
        if time.time() > deadline + 300:
            print("soak: workers did not finish within 300 s of the deadline")
            break
    # Idle again: nothing running, every KV block free, memory back near the baseline.
    t_end = time.time()
    while time.time() - t_end < 10:
        m = metrics(host, port)
        if m["kiln:num_requests_running"] == 0 and m["kiln:num_requests_waiting"] == 0 and \
                m["kiln:kv_cache_blocks_used"] == base["kiln:kv_cache_blocks_used"]:
            break
        time.sleep(0.1)
    rss_growth_mb = (m["process_resident_memory_bytes"] - base["process_resident_memory_bytes"]) / 2**20
    checks = {
        "zero errors on valid requests": stats.counts["valid_error"] == 0,
        "every bad request refused with 4xx": stats.counts["bad_accepted"] == 0,
        "engine idle": m["kiln:num_requests_running"] == 0 and m["kiln:num_requests_waiting"] == 0,
        "KV blocks back to baseline": m["kiln:kv_cache_blocks_used"] == base["kiln:kv_cache_blocks_used"],
        f"RSS within {args.rss_tolerance_mb:.0f} MiB of baseline": rss_growth_mb <= args.rss_tolerance_mb,
    }
    result = {"duration_s": time.time() - t0, "concurrency": args.concurrency, **stats.counts,
              "errors": stats.errors, "rss_baseline_mib": base["process_resident_memory_bytes"] / 2**20,
              "rss_peak_mib": peak_rss / 2**20, "rss_end_mib": m["process_resident_memory_bytes"] / 2**20,
              "kv_blocks_used_end": m["kiln:kv_cache_blocks_used"], "checks": checks}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    ok = all(checks.values())
    print("soak: PASS" if ok else "soak: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
