#!/usr/bin/env python3
"""Benchmark a running OpenAI-compatible server the way `vllm bench serve` does.

Random prompts (token-id lists of a given input length, or text from a file), a fixed output
length (ignore_eos), requests sent at a Poisson rate or with a fixed concurrency, streamed. Prints
vLLM's result block (successful/failed, duration, request and token throughput, mean/median/p99
TTFT, TPOT excluding the first token, ITL); --json saves it; --sweep runs several rates or
concurrencies and draws latency against throughput as an SVG.

    python3 bench/serve_bench.py --base-url http://127.0.0.1:8000 --num-prompts 200 \\
        --random-input-len 1024 --random-output-len 256 --max-concurrency 64
    python3 bench/serve_bench.py --sweep 1,4,16,64 --sweep-mode concurrency --svg sweep.svg --json sweep.json

Standard library only (threads + http.client), so it runs anywhere the server does.
"""
import argparse
import http.client
import json
import math
import random
import statistics
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor


def percentile(xs, p):
    if not xs:
        return 0.0
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Client:
    def __init__(self, base_url, api_key=None, timeout=600):
        u = urllib.parse.urlparse(base_url)
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def get_json(self, path):
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        c.request("GET", path, headers=self.headers)
        r = c.getresponse()
        body = r.read()
        c.close()
        return json.loads(body)

    def stream(self, path, body):
        """Yields (time, parsed chunk) for each SSE event; raises on HTTP errors."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            c.request("POST", path, body=json.dumps(body), headers=self.headers)
            r = c.getresponse()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    break
                j = json.loads(data)
                if "error" in j:
                    raise RuntimeError(j["error"].get("message"))
                yield time.perf_counter(), j
        finally:
            c.close()


def make_prompts(args, rng):
    n = args.num_prompts
    lo = max(1, int(args.random_input_len * (1 - args.random_range_ratio)))
    hi = max(lo, int(args.random_input_len * (1 + args.random_range_ratio)))
    olo = max(1, int(args.random_output_len * (1 - args.random_range_ratio)))
    ohi = max(olo, int(args.random_output_len * (1 + args.random_range_ratio)))
    texts = None
    if args.dataset_path:
        with open(args.dataset_path, encoding="utf-8") as f:
            raw = f.read()
        try:
            texts = [t if isinstance(t, str) else json.dumps(t) for t in json.loads(raw)]
        except json.JSONDecodeError:
            texts = [l for l in raw.splitlines() if l.strip()]
    out = []
    for i in range(n):
        olen = rng.randint(olo, ohi)
        if texts:
            out.append((texts[i % len(texts)], None, olen))
        else:
            ilen = rng.randint(lo, hi)
            out.append(([rng.randrange(args.token_id_low, args.token_id_high) for _ in range(ilen)], ilen, olen))
    return out


def one_request(client, args, model, prompt, out_len):
    body = {"model": model, "max_tokens": out_len, "stream": True, "temperature": args.temperature,
            "ignore_eos": not args.no_ignore_eos, "stream_options": {"include_usage": True}}
    if args.endpoint.endswith("chat/completions"):
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = prompt
    res = {"success": False, "ttft": 0.0, "itl": [], "latency": 0.0, "output_tokens": 0, "prompt_tokens": 0,
           "error": ""}
    t0 = time.perf_counter()
    last = None
    try:
        for t, chunk in client.stream(args.endpoint, body):
            if chunk.get("usage"):
                res["output_tokens"] = chunk["usage"]["completion_tokens"]
                res["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
            for c in chunk.get("choices", []):
                text = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                if text:
                    if last is None:
                        res["ttft"] = t - t0
                    else:
                        res["itl"].append(t - last)
                    last = t
        res["latency"] = time.perf_counter() - t0
        res["success"] = last is not None
        if not res["success"]:
            res["error"] = "no content"
    except Exception as e:  # noqa: BLE001 - every failure is counted, not raised
        res["error"] = str(e)
        res["latency"] = time.perf_counter() - t0
    return res


def run(args, client, model, prompts, request_rate, max_concurrency):
    rng = random.Random(args.seed + 1)
    sem = threading.Semaphore(max_concurrency) if max_concurrency else None
    results = [None] * len(prompts)

    def task(i, prompt, out_len):
        try:
            results[i] = one_request(client, args, model, prompt, out_len)
        finally:
            if sem:
                sem.release()

    workers = min(len(prompts), max_concurrency or len(prompts), 1024)
    t_start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        for i, (prompt, _, out_len) in enumerate(prompts):
            if sem:
                sem.acquire()
            pool.submit(task, i, prompt, out_len)
            if request_rate != math.inf:
                time.sleep(rng.expovariate(request_rate))
    duration = time.perf_counter() - t_start
    ok = [r for r in results if r and r["success"]]
    ttft = [r["ttft"] * 1e3 for r in ok]
    tpot = [(r["latency"] - r["ttft"]) / (r["output_tokens"] - 1) * 1e3 for r in ok if r["output_tokens"] > 1]
    itl = [x * 1e3 for r in ok for x in r["itl"]]
    e2el = [r["latency"] * 1e3 for r in ok]
    total_in = sum(r["prompt_tokens"] for r in ok)
    total_out = sum(r["output_tokens"] for r in ok)
    out = {
        "request_rate": request_rate if request_rate != math.inf else "inf",
        "max_concurrency": max_concurrency,
        "completed": len(ok), "failed": len(prompts) - len(ok),
        "errors": sorted({r["error"] for r in results if r and not r["success"]})[:5],
        "duration": duration, "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration, "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        out[f"mean_{name}_ms"] = statistics.fmean(xs) if xs else 0.0
        out[f"median_{name}_ms"] = statistics.median(xs) if xs else 0.0
        out[f"std_{name}_ms"] = statistics.pstdev(xs) if xs else 0.0
        out[f"p99_{name}_ms"] = percentile(xs, 99)
    return out


def print_block(r):
    w = 50
    line = lambda k, v: print(f"{k:<40}{v:<10}")  # noqa: E731
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=w, c="="))
    line("Successful requests:", r["completed"])
    line("Failed requests:", r["failed"])
    if r["max_concurrency"]:
        line("Maximum request concurrency:", r["max_concurrency"])
    line("Request rate (req/s):", r["request_rate"])
    line("Benchmark duration (s):", f"{r['duration']:.2f}")
    line("Total input tokens:", r["total_input_tokens"])
    line("Total generated tokens:", r["total_output_tokens"])
    line("Request throughput (req/s):", f"{r['request_throughput']:.2f}")
    line("Output token throughput (tok/s):", f"{r['output_throughput']:.2f}")
    line("Total Token throughput (tok/s):", f"{r['total_token_throughput']:.2f}")
    for key, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                       ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        print("{s:{c}^{n}}".format(s=title, n=w, c="-"))
        line(f"Mean {key.upper()} (ms):", f"{r[f'mean_{key}_ms']:.2f}")
        line(f"Median {key.upper()} (ms):", f"{r[f'median_{key}_ms']:.2f}")
        line(f"P99 {key.upper()} (ms):", f"{r[f'p99_{key}_ms']:.2f}")
    if r["errors"]:
        print("errors (first 5):", *r["errors"], sep="\n  ")
    print("=" * w)


def write_svg(path, runs, mode):
    """Median TPOT and median TTFT against output throughput, one point per sweep value."""
    W, H, L, R, T, B = 720, 440, 70, 70, 40, 60
    xs = [r["output_throughput"] for r in runs]
    series = [("median TPOT (ms)", [r["median_tpot_ms"] for r in runs], "#d0602a", "left"),
              ("median TTFT (ms)", [r["median_ttft_ms"] for r in runs], "#2a70d0", "right")]
    xmax = max(xs) * 1.1 if xs and max(xs) > 0 else 1
    sx = lambda x: L + (W - L - R) * x / xmax  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">Latency vs output throughput '
           f'(sweep over {mode})</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>']
    for i in range(6):
        x = xmax * i / 5
        out.append(f'<text x="{sx(x):.1f}" y="{H - B + 16}" text-anchor="middle">{x:.0f}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 20}" text-anchor="middle">output tokens/s</text>')
    for name, ys, color, side in series:
        ymax = max(ys) * 1.15 if ys and max(ys) > 0 else 1
        sy = lambda y: H - B - (H - B - T) * y / ymax  # noqa: E731, B023
        ax = L if side == "left" else W - R
        out.append(f'<line x1="{ax}" y1="{T}" x2="{ax}" y2="{H - B}" stroke="{color}"/>')
        for i in range(6):
            y = ymax * i / 5
            anchor, dx = ("end", -4) if side == "left" else ("start", 4)
            out.append(f'<text x="{ax + dx}" y="{sy(y) + 4:.1f}" text-anchor="{anchor}" fill="{color}">{y:.1f}</text>')
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for r, x, y in zip(runs, xs, ys):
            label = r["max_concurrency"] if mode == "concurrency" else r["request_rate"]
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{color}"/>')
            out.append(f'<text x="{sx(x) + 5:.1f}" y="{sy(y) - 6:.1f}" fill="{color}">{label}</text>')
        lx = L + 10 if side == "left" else W - R - 170
        out.append(f'<text x="{lx}" y="{T + 14}" fill="{color}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/v1/completions", help="/v1/completions or /v1/chat/completions")
    p.add_argument("--model", help="default: the server's first model")
    p.add_argument("--api-key")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=math.inf, help="Poisson rate in req/s (default inf)")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--token-id-low", type=int, default=100, help="random prompts draw ids from [low, high)")
    p.add_argument("--token-id-high", type=int, default=10000)
    p.add_argument("--dataset-path", help="prompts: a JSON list of strings, or one prompt per line")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-ignore-eos", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="save the result (a list of results with --sweep)")
    p.add_argument("--sweep", help="comma-separated rates or concurrencies, e.g. 1,4,16,64")
    p.add_argument("--sweep-mode", choices=["concurrency", "rate"], default="concurrency")
    p.add_argument("--svg", default="serve_sweep.svg", help="with --sweep: where to draw the plot")
    args = p.parse_args()

    client = Client(args.base_url, args.api_key)
    model = args.model or client.get_json("/v1/models")["data"][0]["id"]
    prompts = make_prompts(args, random.Random(args.seed))
    if not args.sweep:
        r = run(args, client, model, prompts, args.request_rate, args.max_concurrency)
        print_block(r)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(r, f, indent=2)
        return 0 if r["failed"] == 0 else 1
    runs = []
    for v in [float(x) for x in args.sweep.split(",")]:
        if args.sweep_mode == "concurrency":
            r = run(args, client, model, prompts, math.inf, int(v))
        else:
            r = run(args, client, model, prompts, v, args.max_concurrency)
        print_block(r)
        runs.append(r)
    print(f"{'value':>8} {'req/s':>8} {'out tok/s':>10} {'TTFT med':>9} {'TPOT med':>9} {'ITL p99':>8}")
    for r in runs:
        v = r["max_concurrency"] if args.sweep_mode == "concurrency" else r["request_rate"]
        print(f"{v!s:>8} {r['request_throughput']:8.2f} {r['output_throughput']:10.1f} {r['median_ttft_ms']:9.1f} "
              f"{r['median_tpot_ms']:9.2f} {r['p99_itl_ms']:8.1f}")
    write_svg(args.svg, runs, args.sweep_mode)
    print(f"plot: {args.svg}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=2)
    return 0 if all(r["failed"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
