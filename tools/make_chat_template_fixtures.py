#!/usr/bin/env python3
"""Writes tests/fixtures/chat_template/{qwen3,deepseek_v3,chatml,synthetic}.json: conversations
rendered by Python jinja2 (pinned in tools/requirements.txt) set up the way Hugging Face
transformers' apply_chat_template sets it up, for nibble's chat-template tests.

The environment mirrors transformers' _compile_jinja_template: an ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and the loopcontrols extension; a tojson filter that is
json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys);
raise_exception() raising TemplateError; strftime_now(); namespace() refusing underscore-prefixed attributes.
Variables: messages, tools and documents (None unless given), add_generation_prompt, the special
tokens that are set in tokenizer_config.json, then the case's extra kwargs. Messages are passed
as given (transformers' own message normalization is not part of the template engine).

qwen3/deepseek_v3 use the templates in <data>/<family>/tokenizer_config.json; chatml uses the
fallback template nibble applies to models without one (kept equal to CHATML below);
synthetic.json holds small templates exercising the Jinja features, filters and tests nibble
implements, including cases where jinja2 raises (recorded as "error").

Usage: tools/make_chat_template_fixtures.py [--data ../shared/data/tokenizers]
                                            [--out tests/fixtures/chat_template]
"""

import argparse
import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from chat_template_cases import CHATML_CASES, DEEPSEEK_CASES, QWEN3_CASES, SYNTHETIC_CASES

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"]


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"underscore-prefixed namespace attribute {name!r}")

    class Generation(jinja2.ext.Extension):
        # transformers' {% generation %} marks assistant text for masks; rendering is unchanged.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    env.globals["namespace"] = Namespace
    return env


ENV = make_environment()


def render(template, messages, add_generation_prompt, extra, special_tokens):
    variables = {"messages": messages, "tools": None, "documents": None, "add_generation_prompt": add_generation_prompt}
    variables.update(special_tokens)
    variables.update(extra)
    return ENV.from_string(template).render(**variables)


def special_tokens_of(config):
    tokens = {}
    for key in SPECIAL_TOKENS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    return tokens


def model_fixture(template, special_tokens, cases):
    out = []
    for case in cases:
        extra = case.get("extra", {})
        for agp in case.get("add_generation_prompt", [True, False]):
            out.append({
                "name": f"{case['name']} (add_generation_prompt={agp})",
                "messages": case["messages"],
                "add_generation_prompt": agp,
                "extra": extra,
                "expected": render(template, case["messages"], agp, extra, special_tokens),
            })
    return {"generator": f"tools/make_chat_template_fixtures.py (jinja2 {jinja2.__version__})",
            "template": template, "special_tokens": special_tokens, "cases": out}


def synthetic_fixture():
    out = []
    for i, case in enumerate(SYNTHETIC_CASES):
        template, extra = case[0], case[1] if len(case) > 1 else {}
        messages = extra.pop("messages", [{"role": "user", "content": "Hi"}])
        agp = extra.pop("add_generation_prompt", True)
        special = extra.pop("special_tokens", {"bos_token": "<s>", "eos_token": "</s>"})
        entry = {"name": f"synthetic {i}", "template": template, "messages": messages,
                 "add_generation_prompt": agp, "special_tokens": special, "extra": extra}
        try:
            entry["expected"] = render(template, messages, agp, extra, special)
        except Exception as e:  # jinja2 refuses it: nibble must throw too
            entry["error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    return {"generator": f"tools/make_chat_template_fixtures.py (jinja2 {jinja2.__version__})", "cases": out}


def write(path, fixture):
    path.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{path}: {len(fixture['cases'])} cases")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/tokenizers"))
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/chat_template"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for family, cases in [("qwen3", QWEN3_CASES), ("deepseek_v3", DEEPSEEK_CASES)]:
        config = json.loads((args.data / family / "tokenizer_config.json").read_text(encoding="utf-8"))
        write(args.out / f"{family}.json", model_fixture(config["chat_template"], special_tokens_of(config), cases))
    write(args.out / "chatml.json", model_fixture(CHATML, {}, CHATML_CASES))
    write(args.out / "synthetic.json", synthetic_fixture())


if __name__ == "__main__":
    main()
