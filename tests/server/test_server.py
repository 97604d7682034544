#!/usr/bin/env python3
"""`nibble serve` on the tiny Mixtral fixture (CPU backend), driven as its users drive it: the official
`openai` package for the happy paths, raw HTTP for streams, concurrency, bad input, disconnects and
metrics. Runs under .venv-test's python (scripts/install-test-deps makes it); re-executes itself there.

Usage: test_server.py PATH_TO_NIBBLE [extra `nibble serve` flags...]   (from the repository root)
With --api-key among the flags every request carries the key, and missing/wrong keys must get 401.
"""
import json
import math
import os
import pathlib
import random
import socket
import subprocess
import sys
import threading
import time
import unittest

VENV_PYTHON = pathlib.Path(".venv-test/bin/python")
sys.path.insert(0, str(pathlib.Path(__file__).parent))
if pathlib.Path(sys.prefix).resolve() != VENV_PYTHON.parent.parent.resolve():
    if not VENV_PYTHON.exists():
        sys.exit("test_server: .venv-test is missing; run scripts/install-test-deps")
    os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), *sys.argv])

import openai  # noqa: E402  (after the re-exec into the venv)

import serve_harness as h  # noqa: E402
from serve_harness import SERVED_NAME, chatml, metrics, request, stream, token_count, wait_for_kv_blocks_free  # noqa: E402

def client():
    return openai.OpenAI(base_url=h.SERVER.url + "/v1", api_key=h.API_KEY or "unused", max_retries=0, timeout=60)


class OpenAIClient(unittest.TestCase):
    def test_models(self):
        models = client().models.list()
        self.assertEqual([m.id for m in models.data], [SERVED_NAME])

    def test_completion(self):
        prompt = "The quick brown fox"
        r = client().completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=12, temperature=0,
                                        extra_body={"ignore_eos": True})
        self.assertTrue(r.id.startswith("cmpl-"))
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(r.model, SERVED_NAME)
        self.assertLessEqual(abs(r.created - time.time()), 60)
        self.assertEqual(len(r.choices), 1)
        self.assertIsInstance(r.choices[0].text, str)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.prompt_tokens, token_count(prompt))
        self.assertEqual(r.usage.completion_tokens, 12)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 12)

        chunks = list(client().completions.create(
            model=SERVED_NAME, prompt=prompt, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        self.assertEqual("".join(c.choices[0].text for c in chunks if c.choices), r.choices[0].text)
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices][-1], "length")
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)
        self.assertEqual(chunks[-1].usage.prompt_tokens, r.usage.prompt_tokens)
        self.assertTrue(all(c.id == chunks[0].id for c in chunks))

    def test_completion_from_token_ids(self):
        ids = [1, 415, 29, 300, 285, 142]
        r = client().completions.create(model=SERVED_NAME, prompt=ids, max_tokens=5, temperature=0,
                                        extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.prompt_tokens, len(ids))
        self.assertEqual(r.usage.completion_tokens, 5)

    def test_chat(self):
        messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there"}]
        r = client().chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=10, temperature=0,
                                             extra_body={"ignore_eos": True})
        self.assertTrue(r.id.startswith("chatcmpl-"))
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertIsInstance(r.choices[0].message.content, str)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.prompt_tokens, token_count(chatml(messages), special=False))
        self.assertEqual(r.usage.completion_tokens, 10)

        chunks = list(client().chat.completions.create(
            model=SERVED_NAME, messages=messages, max_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        self.assertEqual(chunks[0].object, "chat.completion.chunk")
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(content, r.choices[0].message.content)
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices][-1], "length")
        self.assertEqual(chunks[-1].usage.total_tokens, r.usage.total_tokens)

    def test_stream_without_usage_has_no_usage_chunk(self):
        events, done = stream("/v1/completions", {"prompt": "Hi", "max_tokens": 3, "ignore_eos": True})
        self.assertTrue(done)
        self.assertTrue(all("usage" not in e for e in events))
        self.assertEqual(events[-1]["choices"][0]["finish_reason"], "length")


class Concurrency(unittest.TestCase):
    def test_65_concurrent_streams_equal_each_request_alone(self):
        rng = random.Random(7)
        words = ["alpha", "river", "stone", "quick", "blue", "seven", "over", "the", "lazy", "dog", "moon",
                 "paper", "light", "z", "é", "数", "!", "42"]
        # The first request is long and starts first, the 64 others once it runs: they share its steps
        # however slowly a loaded machine lets this client send them.
        requests = [{"prompt": "Once upon a time", "max_tokens": 480, "temperature": 0, "ignore_eos": True}]
        for i in range(64):
            prompt = " ".join(rng.choice(words) for _ in range(rng.randint(1, 60)))
            requests.append({"prompt": prompt, "max_tokens": rng.randint(1, 40), "temperature": 0,
                             "ignore_eos": True})
        alone = []
        for body in requests:
            status, r = request("POST", "/v1/completions", body)
            self.assertEqual(status, 200, r)
            alone.append((r["choices"][0]["text"], r["usage"]["completion_tokens"]))

        results = [None] * len(requests)

        def step_histogram():  # (engine steps that gave a token to more than one request, tokens given)
            m = metrics()
            return (m["nibble_step_requests_count"] - m['nibble_step_requests_bucket{le="1"}'],
                    m["nibble_step_requests_sum"])

        batched_before, tokens_before = step_histogram()

        def run(i):
            try:
                events, done = stream("/v1/completions", {**requests[i], "stream_options": {"include_usage": True}})
                text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
                results[i] = (text, events[-1]["usage"]["completion_tokens"], done)
            except Exception as e:  # reported below, per request
                results[i] = e

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
        threads[0].start()
        deadline = time.time() + 30
        while metrics()["nibble_num_requests_running"] < 1 and results[0] is None and time.time() < deadline:
            time.sleep(0.005)
        self.assertIsNone(results[0], "the long request ended before the others could start")
        for t in threads[1:]:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for i, (want, got) in enumerate(zip(alone, results)):
            self.assertIsInstance(got, tuple, f"request {i}: {got}")
            self.assertTrue(got[2], f"request {i} did not end with [DONE]")
            self.assertEqual(got[:2], want, f"request {i}")
        batched_after, tokens_after = step_histogram()
        self.assertEqual(tokens_after - tokens_before, sum(n for _, n in alone))
        self.assertGreater(batched_after, batched_before, "the requests were never batched")
        wait_for_kv_blocks_free(self)


class Logprobs(unittest.TestCase):
    BODY = {"prompt": "Hello", "max_tokens": 8, "temperature": 0, "ignore_eos": True}

    def completion(self, **extra):
        status, r = request("POST", "/v1/completions", {**self.BODY, **extra})
        self.assertEqual(status, 200, r)
        return r

    def test_completion_logprobs(self):
        r = self.completion(logprobs=3)
        lp = r["choices"][0]["logprobs"]
        n = r["usage"]["completion_tokens"]
        self.assertEqual([len(lp[k]) for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")], [n] * 4)
        self.assertEqual(lp["text_offset"][0], 0)
        for i in range(n):
            self.assertLessEqual(lp["token_logprobs"][i], 0.0)
            top = lp["top_logprobs"][i]
            self.assertTrue(1 <= len(top) <= 4, top)  # the top 3 and the token's own (as vLLM)
            self.assertEqual(top[lp["tokens"][i]], lp["token_logprobs"][i])
            # Greedy: the sampled token is the most likely one.
            self.assertAlmostEqual(lp["token_logprobs"][i], max(top.values()), places=5)
            self.assertLessEqual(sum(math.exp(v) for v in top.values()), 1.0 + 1e-5)
            if i:
                self.assertEqual(lp["text_offset"][i], lp["text_offset"][i - 1] + len(lp["tokens"][i - 1]))
        self.assertIsNone(self.completion()["choices"][0]["logprobs"])
        # Streamed, the chunks' logprobs put together are the whole response's.
        events, done = stream("/v1/completions", {**self.BODY, "logprobs": 3})
        self.assertTrue(done)
        joined = {k: [] for k in lp}
        for e in events:
            if e["choices"] and e["choices"][0]["logprobs"]:
                for k in joined:
                    joined[k] += e["choices"][0]["logprobs"][k]
        self.assertEqual(joined, lp)

    def test_tokens_as_ids_name_the_sampled_tokens(self):
        r = self.completion(logprobs=0, return_tokens_as_token_ids=True)
        tokens = r["choices"][0]["logprobs"]["tokens"]
        self.assertTrue(all(t.startswith("token_id:") for t in tokens), tokens)
        tops = r["choices"][0]["logprobs"]["top_logprobs"]
        self.assertEqual([list(t) for t in tops], [[t] for t in tokens])  # logprobs 0: the token's own alone
        ids = [int(t.split(":")[1]) for t in tokens]
        # Stopping on the fourth token's id ends the greedy text at its first occurrence.
        stop = ids[3]
        r = self.completion(stop_token_ids=[stop])
        self.assertEqual(r["choices"][0]["finish_reason"], "stop")
        self.assertEqual(r["usage"]["completion_tokens"], ids.index(stop) + 1)

    def test_min_tokens_holds_off_stop_tokens_and_strings(self):
        r = self.completion(logprobs=0, return_tokens_as_token_ids=True)
        ids = [int(t.split(":")[1]) for t in r["choices"][0]["logprobs"]["tokens"]]
        full = self.completion()["choices"][0]["text"]
        # The first greedy token as a stop token: alone it ends the request at once; with min_tokens 3
        # it cannot come first, and the request runs at least 3 tokens.
        self.assertEqual(self.completion(stop_token_ids=[ids[0]])["usage"]["completion_tokens"], 1)
        r = self.completion(stop_token_ids=[ids[0]], min_tokens=3, logprobs=0, return_tokens_as_token_ids=True)
        got = [int(t.split(":")[1]) for t in r["choices"][0]["logprobs"]["tokens"]]
        self.assertGreaterEqual(len(got), 3)
        self.assertNotIn(ids[0], got[:3])
        # A stop string in the first tokens' text is not looked for until min_tokens have come.
        stop = full[:2]
        self.assertTrue(stop.strip(), f"degenerate text {full!r}")
        self.assertEqual(self.completion(stop=[stop])["choices"][0]["text"], "")
        held = self.completion(stop=[stop], min_tokens=4)
        self.assertGreaterEqual(held["usage"]["completion_tokens"], 4)
        self.assertTrue(full.startswith(held["choices"][0]["text"][:len(stop)]), (held, full))

    def test_echo_gives_the_prompt_and_its_logprobs_first(self):
        prompt = "The quick brown fox"
        plain = self.completion(prompt=prompt, logprobs=2)
        r = self.completion(prompt=prompt, logprobs=2, echo=True)
        text = r["choices"][0]["text"]
        self.assertEqual(text, prompt + plain["choices"][0]["text"])
        lp, gen = r["choices"][0]["logprobs"], plain["choices"][0]["logprobs"]
        n = token_count(prompt)
        self.assertEqual(len(lp["tokens"]), n + len(gen["tokens"]))
        self.assertEqual(lp["tokens"][n:], gen["tokens"])
        self.assertEqual(lp["token_logprobs"][n:], gen["token_logprobs"])
        self.assertIsNone(lp["token_logprobs"][0])
        self.assertIsNone(lp["top_logprobs"][0])
        self.assertTrue(all(v <= 0 for v in lp["token_logprobs"][1:n]))
        # Generated tokens put back as prompt: their prompt log-probabilities are the ones they were
        # generated with (one prefill against decode steps: equal within float error).
        status, t = request("POST", "/tokenize", {"prompt": prompt})
        ids = t["tokens"]
        g = self.completion(prompt=ids, max_tokens=4, logprobs=1, return_tokens_as_token_ids=True)
        generated = [int(x.split(":")[1]) for x in g["choices"][0]["logprobs"]["tokens"]]
        e = self.completion(prompt=ids + generated, max_tokens=1, logprobs=1, echo=True)
        for j in range(4):
            self.assertAlmostEqual(e["choices"][0]["logprobs"]["token_logprobs"][len(ids) + j],
                                   g["choices"][0]["logprobs"]["token_logprobs"][j], places=3)
        # Streamed: the first chunk begins with the prompt.
        events, done = stream("/v1/completions", {**self.BODY, "prompt": prompt, "echo": True})
        self.assertTrue(events[0]["choices"][0]["text"].startswith(prompt))
        self.assertEqual("".join(e["choices"][0]["text"] for e in events if e["choices"]), text)

    def test_chat_logprobs(self):
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0,
                "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
        status, r = request("POST", "/v1/chat/completions", body)
        self.assertEqual(status, 200, r)
        content = r["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(content), r["usage"]["completion_tokens"])
        for t in content:
            self.assertEqual(t["bytes"], list(t["token"].encode()))
            self.assertEqual(len(t["top_logprobs"]), 2)
            self.assertAlmostEqual(t["logprob"], t["top_logprobs"][0]["logprob"], places=5)
            self.assertGreaterEqual(t["top_logprobs"][0]["logprob"], t["top_logprobs"][1]["logprob"])
        chat = client().chat.completions.create(model=SERVED_NAME, messages=body["messages"], max_tokens=5,
                                                temperature=0, logprobs=True, top_logprobs=2,
                                                extra_body={"ignore_eos": True})
        self.assertEqual([t.token for t in chat.choices[0].logprobs.content], [t["token"] for t in content])


class Choices(unittest.TestCase):
    BODY = {"prompt": "Once upon a time", "max_tokens": 12, "ignore_eos": True, "temperature": 0.9, "seed": 11}

    def test_n_choices_are_the_seeds_one_by_one(self):
        status, r = request("POST", "/v1/completions", {**self.BODY, "n": 3, "logprobs": 1})
        self.assertEqual(status, 200, r)
        self.assertEqual([c["index"] for c in r["choices"]], [0, 1, 2])
        # Choice i samples as the request with seed + i alone does.
        for i, choice in enumerate(r["choices"]):
            status, alone = request("POST", "/v1/completions", {**self.BODY, "seed": 11 + i, "logprobs": 1})
            self.assertEqual(choice["text"], alone["choices"][0]["text"], f"choice {i}")
            self.assertEqual(choice["logprobs"]["tokens"], alone["choices"][0]["logprobs"]["tokens"])
            self.assertEqual(choice["finish_reason"], "length")
        self.assertEqual(r["usage"]["completion_tokens"], 3 * 12)
        self.assertEqual(r["usage"]["prompt_tokens"], token_count("Once upon a time"))
        self.assertGreater(len({c["text"] for c in r["choices"]}), 1, "three seeds sampled one text")
        # Streamed: each choice's pieces, put together, are its whole text; one finish each.
        events, done = stream("/v1/completions", {**self.BODY, "n": 3, "stream_options": {"include_usage": True}})
        self.assertTrue(done)
        texts, finishes = ["", "", ""], [[], [], []]
        for e in events:
            for c in e["choices"]:
                texts[c["index"]] += c["text"]
                if c["finish_reason"]:
                    finishes[c["index"]].append(c["finish_reason"])
        self.assertEqual(texts, [c["text"] for c in r["choices"]])
        self.assertEqual(finishes, [["length"]] * 3)
        self.assertEqual(events[-1]["usage"]["completion_tokens"], 36)
        wait_for_kv_blocks_free(self)

    def test_chat_n_with_the_openai_client(self):
        chat = client().chat.completions.create(model=SERVED_NAME, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=6, temperature=0.8, seed=5, n=2,
                                                extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in chat.choices], [0, 1])
        self.assertEqual(chat.usage.completion_tokens, 12)
        chunks = list(client().chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0.8,
            seed=5, n=2, stream=True, extra_body={"ignore_eos": True}))
        texts = ["", ""]
        for chunk in chunks:
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
        self.assertEqual(texts, [c.message.content for c in chat.choices])


class Tokenize(unittest.TestCase):
    def test_tokenize_counts_what_generation_counts(self):
        text = "The quick brown fox"
        status, t = request("POST", "/tokenize", {"prompt": text})
        self.assertEqual(status, 200, t)
        self.assertEqual(t["count"], len(t["tokens"]))
        self.assertEqual(t["count"], token_count(text))
        self.assertEqual(t["max_model_len"], 512)
        status, r = request("POST", "/v1/completions", {"prompt": text, "max_tokens": 1})
        self.assertEqual(r["usage"]["prompt_tokens"], t["count"])
        messages = [{"role": "user", "content": "Tell me a story"}]
        status, c = request("POST", "/tokenize", {"messages": messages})
        self.assertEqual(status, 200, c)
        status, r = request("POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 1})
        self.assertEqual(r["usage"]["prompt_tokens"], c["count"])
        self.assertEqual(c["count"], token_count(chatml(messages), special=False))
        # And back: the ids without BOS give the text again.
        status, plain = request("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})
        status, d = request("POST", "/detokenize", {"tokens": plain["tokens"]})
        self.assertEqual(status, 200, d)
        self.assertEqual(d, {"prompt": text})

    def test_bad_token_requests(self):
        for path, body, param in [("/tokenize", {}, "prompt"), ("/detokenize", {"tokens": [1, 512]}, "tokens"),
                                  ("/detokenize", {"tokens": "12"}, "tokens")]:
            status, r = request("POST", path, body)
            self.assertEqual(status, 400, r)
            self.assertEqual(r["error"]["param"], param)
        status, r = request("POST", "/tokenize", {"prompt": "x", "model": "another"})
        self.assertEqual(status, 404, r)
        status, r = request("GET", "/tokenize")
        self.assertEqual(status, 405, r)


class BadInput(unittest.TestCase):
    CASES = [
        # (path, body, status, param)
        ("/v1/completions", b"{not json", 400, None),
        ("/v1/completions", b"[1, 2]", 400, None),
        ("/v1/completions", b'{"prompt": "\xff\xfe"}', 400, None),  # invalid UTF-8
        ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),
        ("/v1/completions", {"prompt": 5}, 400, "prompt"),
        ("/v1/completions", {"prompt": []}, 400, "prompt"),
        ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
        ("/v1/completions", {"prompt": [1, 99999]}, 400, "prompt"),
        ("/v1/completions", {"prompt": [1, -3]}, 400, "prompt"),
        ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
        ("/v1/completions", {"prompt": "hi", "temperature": 2.5}, 400, "temperature"),
        ("/v1/completions", {"prompt": "hi", "temperature": -0.1}, 400, "temperature"),
        ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
        ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
        ("/v1/completions", {"prompt": "hi", "top_k": -2}, 400, "top_k"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "10"}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 1.5}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 100000}, 400, "max_tokens"),  # beyond the context
        ("/v1/completions", {"prompt": "hi " * 600}, 400, "prompt"),  # longer than the context
        ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n"),
        ("/v1/completions", {"prompt": "hi", "presence_penalty": 2.5}, 400, "presence_penalty"),
        ("/v1/completions", {"prompt": "hi", "repetition_penalty": 0}, 400, "repetition_penalty"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 5, "min_tokens": 6}, 400, "min_tokens"),
        ("/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "echo": True}, 400, "echo"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400,
         "top_logprobs"),
        ("/v1/completions", {"prompt": "hi", "stop_token_ids": [512]}, 400, "stop_token_ids"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": "1"},
         400, "frequency_penalty"),
        ("/v1/completions", {"prompt": "hi", "seed": "x"}, 400, "seed"),
        ("/v1/completions", {"prompt": "hi", "stop": 5}, 400, "stop"),
        ("/v1/completions", {"prompt": "hi", "stop": [""]}, 400, "stop"),
        ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
        ("/v1/completions", {"prompt": "hi", "ignore_eos": 1}, 400, "ignore_eos"),
        ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model"),
        ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, None),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_p": -1}, 400, "top_p"),
    ]

    def check_error(self, status, body, want_status, want_param=None):
        self.assertEqual(status, want_status, body)
        self.assertIsInstance(body, dict, body)
        error = body["error"]
        self.assertEqual(set(error), {"message", "type", "param", "code"})
        self.assertIsInstance(error["message"], str)
        self.assertTrue(error["message"])
        if want_param:
            self.assertEqual(error["param"], want_param, error)

    def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(self):
        for path, body, want, param in self.CASES:
            with self.subTest(path=path, body=body):
                status, got = request("POST", path, body)
                self.check_error(status, got, want, param)
        status, got = request("GET", "/v1/nothing-here")
        self.check_error(status, got, 404)
        status, got = request("GET", "/v1/completions")
        self.check_error(status, got, 405)
        status, got = request("POST", "/v1/completions", b'{"prompt": "' + b"a" * (9 << 20) + b'"}')
        self.check_error(status, got, 413)
        # The server still answers normally.
        status, got = request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 3, "ignore_eos": True})
        self.assertEqual(status, 200, got)
        self.assertEqual(got["usage"]["completion_tokens"], 3)

    def test_openai_client_raises_bad_request(self):
        with self.assertRaises(openai.BadRequestError):
            client().completions.create(model=SERVED_NAME, prompt="hi", max_tokens=0)

    def test_api_key(self):
        if not h.API_KEY:
            status, _ = request("GET", "/v1/models", key="anything")
            self.assertEqual(status, 200)
            return
        for key in [None, "wrong"]:
            status, got = request("POST", "/v1/completions", {"prompt": "hi"}, key=key)
            self.check_error(status, got, 401)
        status, _ = request("GET", "/health", key=None)  # health and metrics stay open
        self.assertEqual(status, 200)
        with self.assertRaises(openai.AuthenticationError):
            openai.OpenAI(base_url=h.SERVER.url + "/v1", api_key="wrong", max_retries=0).models.list()


class Disconnect(unittest.TestCase):
    def test_client_that_disconnects_mid_stream_frees_its_kv_blocks(self):
        wait_for_kv_blocks_free(self)
        aborted_before = metrics().get('nibble_requests_finished_total{finish_reason="abort"}', 0)
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 480, "ignore_eos": True, "stream": True})
        sock = socket.create_connection((h.SERVER.host, h.SERVER.port))
        auth = f"Authorization: Bearer {h.API_KEY}\r\n" if h.API_KEY else ""
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        received = b""
        while received.count(b"data: ") < 3:
            received += sock.recv(4096)
        self.assertGreater(metrics()["nibble_kv_blocks_used"], 0)
        sock.close()
        wait_for_kv_blocks_free(self)
        self.assertEqual(metrics()['nibble_requests_finished_total{finish_reason="abort"}'], aborted_before + 1)


class Listen(unittest.TestCase):
    def test_listen_queue_holds_many_clients_connecting_at_once(self):
        # The kernel's own report of the listening socket (ss: Send-Q is its backlog). httplib listens
        # with 5, compiled into Debian's library; 65 clients at once on a loaded machine saw resets.
        try:
            out = subprocess.run(["ss", "-ltnH", f"sport = :{h.SERVER.port}"], capture_output=True, text=True,
                                 check=True).stdout
        except (FileNotFoundError, subprocess.CalledProcessError) as e:
            self.skipTest(f"ss: {e}")
        fields = out.split()
        self.assertGreaterEqual(len(fields), 3, out)
        somaxconn = int(pathlib.Path("/proc/sys/net/core/somaxconn").read_text())
        self.assertEqual(int(fields[2]), min(2048, somaxconn), out)


class SlowClient(unittest.TestCase):
    def test_request_sent_three_seconds_after_connecting_is_served(self):
        # A loaded machine can delay a client between its connect and its request; the server must
        # not have closed the connection by then (it did at a 2 s idle timeout).
        sock = socket.create_connection((h.SERVER.host, h.SERVER.port), timeout=30)
        time.sleep(3)
        auth = f"Authorization: Bearer {h.API_KEY}\r\n" if h.API_KEY else ""
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode())
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
        sock.close()
        self.assertTrue(received.startswith(b"HTTP/1.1 200"), received[:100])


class StopAndSeed(unittest.TestCase):
    def complete(self, prompt="Once upon a time", **body):
        status, r = request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 40, "ignore_eos": True, **body})
        self.assertEqual(status, 200, r)
        return r

    def test_stop_string_ends_the_text_before_it(self):
        full = self.complete(temperature=0)["choices"][0]["text"]
        # A stop string from the middle of the greedy text, starting at its first occurrence.
        start = len(full) // 2
        stop = full[start:start + 3]
        cut = full.index(stop)
        self.assertTrue(stop.strip(), f"degenerate text {full!r}")
        r = self.complete(temperature=0, stop=["never-appears-xyz", stop])
        self.assertEqual(r["choices"][0]["text"], full[:cut])
        self.assertEqual(r["choices"][0]["finish_reason"], "stop")
        self.assertLess(r["usage"]["completion_tokens"], 40)
        events, done = stream("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True,
                                                  "temperature": 0, "stop": stop})
        self.assertTrue(done)
        self.assertEqual("".join(e["choices"][0]["text"] for e in events), full[:cut])
        self.assertEqual(events[-1]["choices"][0]["finish_reason"], "stop")
        wait_for_kv_blocks_free(self)

    def test_stop_string_in_chat(self):
        messages = [{"role": "user", "content": "Tell me a story"}]
        full = client().chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=30,
                                                temperature=0, extra_body={"ignore_eos": True})
        text = full.choices[0].message.content
        stop = text[len(text) // 2:len(text) // 2 + 2]
        r = client().chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=30, temperature=0,
                                             stop=[stop], extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].message.content, text[:text.index(stop)])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_stop_token_ids_end_on_the_token_and_hide_its_text(self):
        prompt = "Hello"  # its first greedy token shows text
        first = self.complete(prompt=prompt, temperature=0, max_tokens=1)["choices"][0]
        self.assertTrue(first["text"], "the first token shows no text: the test would not tell")
        # The first greedy token's id, by halving: a set of stop ids ends the request with "stop"
        # exactly when that token is in it.
        low, high = 0, 512  # the fixture's vocabulary
        while high - low > 1:
            mid = (low + high) // 2
            r = self.complete(prompt=prompt, temperature=0, max_tokens=1, stop_token_ids=list(range(low, mid)))
            if r["choices"][0]["finish_reason"] == "stop":
                high = mid
            else:
                low = mid
        token = low
        r = self.complete(prompt=prompt, temperature=0, stop_token_ids=[token])
        self.assertEqual(r["choices"][0]["finish_reason"], "stop")
        self.assertEqual(r["choices"][0]["text"], "")  # counted, not shown (as vLLM)
        self.assertEqual(r["usage"]["completion_tokens"], 1)
        others = [i for i in range(512) if i != token]
        r = self.complete(prompt=prompt, temperature=0, max_tokens=1, stop_token_ids=others)
        self.assertEqual(r["choices"][0]["finish_reason"], "length")
        self.assertEqual(r["choices"][0]["text"], first["text"])
        events, done = stream("/v1/completions", {"prompt": prompt, "max_tokens": 40, "ignore_eos": True,
                                                  "temperature": 0, "stop_token_ids": [token],
                                                  "stream_options": {"include_usage": True}})
        self.assertTrue(done)
        self.assertEqual("".join(e["choices"][0]["text"] for e in events if e["choices"]), "")
        self.assertEqual([e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1], "stop")
        self.assertEqual(events[-1]["usage"]["completion_tokens"], 1)
        wait_for_kv_blocks_free(self)

    def test_penalties_change_greedy_text_reproducibly(self):
        plain = self.complete(prompt="The quick brown fox", temperature=0)["choices"][0]["text"]
        body = {"prompt": "The quick brown fox", "temperature": 0, "repetition_penalty": 3.0,
                "frequency_penalty": 1.0, "presence_penalty": 0.5}
        penalized = self.complete(**body)["choices"][0]["text"]
        self.assertNotEqual(penalized, plain)
        self.assertEqual(self.complete(**body)["choices"][0]["text"], penalized)
        # Neutral values are no penalties at all.
        neutral = self.complete(prompt="The quick brown fox", temperature=0, repetition_penalty=1,
                                frequency_penalty=0, presence_penalty=0)
        self.assertEqual(neutral["choices"][0]["text"], plain)

    def test_logit_bias_steers_greedy_text(self):
        r = self.complete(prompt="Hello", temperature=0, max_tokens=5, logit_bias={"77": 100},
                          logprobs=0, return_tokens_as_token_ids=True)
        self.assertEqual(r["choices"][0]["logprobs"]["tokens"], ["token_id:77"] * 5)
        # The raw log-probabilities are the model's: the bias does not enter them (as vLLM's default).
        plain = self.complete(prompt="Hello", temperature=0, max_tokens=1, logprobs=20,
                              return_tokens_as_token_ids=True)
        self.assertNotEqual(plain["choices"][0]["logprobs"]["tokens"][0], "token_id:77")
        status, r = request("POST", "/v1/completions", {"prompt": "hi", "logit_bias": {"512": 1}})
        self.assertEqual((status, r["error"]["param"]), (400, "logit_bias"))

    def test_seed_reproduces_sampling(self):
        a = self.complete(temperature=0.9, top_p=0.95, seed=123)["choices"][0]["text"]
        b = self.complete(temperature=0.9, top_p=0.95, seed=123)["choices"][0]["text"]
        self.assertEqual(a, b)
        others = {self.complete(temperature=0.9, top_p=0.95, seed=s)["choices"][0]["text"] for s in (1, 2, 3)}
        self.assertGreater(len(others | {a}), 1, "different seeds never changed the text")
        unseeded = {self.complete(temperature=0.9, top_p=0.95)["choices"][0]["text"] for _ in range(3)}
        self.assertGreater(len(unseeded), 1, "requests without a seed all sampled the same text")


class TimedResult(unittest.TextTestResult):
    def startTest(self, test):
        self._started = time.time()
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        self.stream.writeln(f"    ({time.time() - self._started:.2f} s)")


class TimedRunner(unittest.TextTestRunner):
    resultclass = TimedResult


def main():
    h.NIBBLE, flags = sys.argv[1], sys.argv[2:]
    if "--api-key" in flags:
        h.API_KEY = flags[flags.index("--api-key") + 1]
    start = time.time()
    h.SERVER = h.Server(h.NIBBLE, flags)
    print(f"server ready in {time.time() - start:.1f} s at {h.SERVER.url}")
    try:
        result = unittest.main(argv=[sys.argv[0], "-v"], exit=False, testRunner=TimedRunner).result
    finally:
        stopping = time.time()
        code = h.SERVER.stop()
    print(f"server exited with status {code} in {time.time() - stopping:.1f} s")
    ok = result.wasSuccessful() and code == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
