#!/usr/bin/env python3
"""Serving benchmark for an OpenAI-compatible server (`nibble serve`, SGLang, vLLM): random prompts
and output lengths from a seed, sent at a request rate (Poisson arrivals) and/or up to a maximum
concurrency, all streamed. Reports request throughput, input and output tokens/s, time to first token,
inter-token latency (between streamed chunks), time per output token and end-to-end latency
(mean, p50, p90, p99), as a table and as JSON. Standard library only.

  tools/bench_serving.py --base-url http://127.0.0.1:30000 --num-prompts 200 \
      --random-input-len 512 --random-output-len 128 --max-concurrency 32 --output-file result.json

Completions prompts are random token ids (exact input lengths; ids drawn from [--min-token-id,
--max-token-id)), chat prompts random words. ignore_eos is sent so outputs have the drawn lengths.
"""
import argparse
import http.client
import json
import math
import random
import sys
import threading
import time
import urllib.parse

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river stone light paper moon seven blue quick over").split()


def percentile(values, p):
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(values, scale=1000.0):
    """Mean and percentiles, in milliseconds by default."""
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": sum(values) / len(values) * scale, "p50": percentile(values, 50) * scale,
            "p90": percentile(values, 90) * scale, "p99": percentile(values, 99) * scale}


class Client:
    def __init__(self, base_url, api_key, timeout):
        url = urllib.parse.urlparse(base_url)
        self.host, self.port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
        self.https = url.scheme == "https"
        self.prefix = url.path.rstrip("/")
        if not self.prefix.endswith("/v1"):
            self.prefix += "/v1"
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def connect(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def get(self, path):
        conn = self.connect()
        conn.request("GET", self.prefix + path, headers=self.headers)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: {resp.status} {body[:200]!r}")
        return json.loads(body)

    def stream(self, path, body):
        """Sends one streamed request; returns a record of its timings and token counts."""
        record = {"ok": False, "ttft": None, "chunk_times": [], "prompt_tokens": 0, "output_tokens": 0,
                  "latency": None, "error": None}
        start = time.perf_counter()
        try:
            conn = self.connect()
            conn.request("POST", self.prefix + path, body=json.dumps(body), headers=self.headers)
            resp = conn.getresponse()
            if resp.status != 200:
                record["error"] = f"{resp.status} {resp.read()[:300]!r}"
                return record
            done = False
            for raw in resp:
                line = raw.decode("utf-8", errors="replace").strip()
                if line == "data: [DONE]":
                    done = True
                if not line.startswith("data: ") or done:
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    record["error"] = event["error"].get("message", str(event["error"]))
                    return record
                if event.get("usage"):
                    record["prompt_tokens"] = event["usage"]["prompt_tokens"]
                    record["output_tokens"] = event["usage"]["completion_tokens"]
                for choice in event.get("choices", []):
                    piece = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                    # Tokens that decode to no text (skipped special tokens) send nothing until the end.
                    if not piece and not choice.get("finish_reason"):
                        continue
                    now = time.perf_counter()
                    if record["ttft"] is None:
                        record["ttft"] = now - start
                    if piece:
                        record["chunk_times"].append(now)
            conn.close()
            record["latency"] = time.perf_counter() - start
            record["ok"] = done
            if not done:
                record["error"] = "the stream ended without [DONE]"
        except (OSError, http.client.HTTPException, ValueError) as e:
            record["error"] = repr(e)
        return record


def make_requests(args, model):
    rng = random.Random(args.seed)
    lo_in = max(1, int(args.random_input_len * args.random_range_ratio))
    lo_out = max(1, int(args.random_output_len * args.random_range_ratio))
    requests = []
    for _ in range(args.num_prompts):
        input_len = rng.randint(lo_in, args.random_input_len)
        output_len = rng.randint(lo_out, args.random_output_len)
        body = {"model": model, "max_tokens": output_len, "temperature": args.temperature, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": not args.no_ignore_eos}
        if args.endpoint == "chat":
            text = " ".join(rng.choice(WORDS) for _ in range(input_len))
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = [rng.randrange(args.min_token_id, args.max_token_id) for _ in range(input_len)]
        requests.append(body)
    return requests


def run(args):
    client = Client(args.base_url, args.api_key, args.timeout)
    model = args.model or client.get("/models")["data"][0]["id"]
    requests = make_requests(args, model)
    path = "/chat/completions" if args.endpoint == "chat" else "/completions"
    arrivals = random.Random(args.seed + 1)
    limit = threading.Semaphore(args.max_concurrency) if args.max_concurrency else None
    records = [None] * len(requests)

    def one(i):
        try:
            records[i] = client.stream(path, requests[i])
        finally:
            if limit:
                limit.release()

    if args.warmup:
        client.stream(path, {**requests[0], "max_tokens": 4})
    threads = []
    start = time.perf_counter()
    for i in range(len(requests)):
        if limit:
            limit.acquire()
        t = threading.Thread(target=one, args=(i,), daemon=True)
        t.start()
        threads.append(t)
        if args.request_rate != float("inf"):
            time.sleep(arrivals.expovariate(args.request_rate))
    for t in threads:
        t.join()
    duration = time.perf_counter() - start
    return model, records, duration


def report(args, model, records, duration):
    done = [r for r in records if r and r["ok"]]
    failed = [r for r in records if not r or not r["ok"]]
    ttft = [r["ttft"] for r in done if r["ttft"] is not None]
    itl = [b - a for r in done for a, b in zip(r["chunk_times"], r["chunk_times"][1:])]
    tpot = [(r["latency"] - r["ttft"]) / (r["output_tokens"] - 1) for r in done
            if r["ttft"] is not None and r["output_tokens"] > 1]
    input_tokens = sum(r["prompt_tokens"] for r in done)
    output_tokens = sum(r["output_tokens"] for r in done)
    result = {
        "model": model,
        "endpoint": args.endpoint,
        "num_prompts": args.num_prompts,
        "request_rate": None if args.request_rate == float("inf") else args.request_rate,
        "max_concurrency": args.max_concurrency,
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "seed": args.seed,
        "duration_s": duration,
        "completed": len(done),
        "failed": len(failed),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration,
        "input_throughput": input_tokens / duration,
        "output_throughput": output_tokens / duration,
        "ttft_ms": summary(ttft),
        "itl_ms": summary(itl),
        "tpot_ms": summary(tpot),
        "e2e_latency_ms": summary([r["latency"] for r in done]),
        "errors": sorted({r["error"] for r in failed if r and r["error"]})[:5],
    }
    print(f"{'model':<28}{model}")
    for key in ["completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens",
                "request_throughput", "input_throughput", "output_throughput"]:
        value = result[key]
        print(f"{key:<28}{value:.2f}" if isinstance(value, float) else f"{key:<28}{value}")
    for key in ["ttft_ms", "itl_ms", "tpot_ms", "e2e_latency_ms"]:
        s = result[key]
        if s["mean"] is None:
            print(f"{key:<28}n/a")
        else:
            print(f"{key:<28}mean {s['mean']:.2f}  p50 {s['p50']:.2f}  p90 {s['p90']:.2f}  p99 {s['p99']:.2f}")
    for e in result["errors"]:
        print(f"error: {e}", file=sys.stderr)
    text = json.dumps(result, indent=2)
    if args.output_file:
        with open(args.output_file, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", default=None, help="default: the first of /v1/models")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf: all at once")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--random-input-len", type=int, default=256)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--random-range-ratio", type=float, default=0.5, help="lengths drawn from [ratio*len, len]")
    p.add_argument("--min-token-id", type=int, default=10)
    p.add_argument("--max-token-id", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-ignore-eos", action="store_true", help="let outputs end at end-of-sequence")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup", action="store_true", help="one short request first, not measured")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--output-file", default=None, help="write the JSON result here (else print it)")
    args = p.parse_args()
    if not 0 < args.random_range_ratio <= 1:
        p.error("--random-range-ratio must be in (0, 1]")
    model, records, duration = run(args)
    result = report(args, model, records, duration)
    sys.exit(1 if result["failed"] else 0)


if __name__ == "__main__":
    main()
