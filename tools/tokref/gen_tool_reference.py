#!/usr/bin/env python3
"""Renders tool conversations with the official Qwen2.5-Instruct and Llama 3.1-Instruct chat
templates (tests/data/tokenizer/qwen2.5.jinja, llama3.1.jinja) the way Hugging Face
transformers' apply_chat_template does -- jinja2 with trim_blocks, lstrip_blocks, the
loopcontrols extension and transformers' own `tojson` (json.dumps, ensure_ascii=False) --
and writes tests/data/tokenizer/chat_tools_reference.json for src/tokenizer/chat_tools_test.cc.

Messages are stored in the OpenAI wire format (a tool call's `arguments` is a JSON text);
as vLLM and llama.cpp do, the arguments are parsed into a mapping before rendering.
Usage (from the repo root): python3 tools/tokref/gen_tool_reference.py   (Debian: python3-jinja2)
"""
import copy
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(REPO, "tests", "data", "tokenizer")


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def render(template_text, messages, tools, bos_token):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    hf_messages = copy.deepcopy(messages)
    for m in hf_messages:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    kwargs = dict(messages=hf_messages, add_generation_prompt=True, bos_token=bos_token, eos_token="")
    if tools is not None:
        kwargs["tools"] = tools
    return env.from_string(template_text).render(**kwargs)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city — \"quoted\" and\nmultiline",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                        "filters": {"type": "array", "items": {"type": "string"}},
                                                        "limit": {"type": "number"}}, "required": []},
    },
}
EMPTY = {"type": "function", "function": {"name": "now", "description": "", "parameters": {"type": "object", "properties": {}}}}


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


CASES = [
    ("tools, one user turn", None, [{"role": "user", "content": "Weather in Paris?"}], [WEATHER]),
    ("system, tools, a call and its result", "both", [
        {"role": "system", "content": "  You answer briefly.  "},
        {"role": "user", "content": " Weather in Zürich for 3 days? "},
        {"role": "assistant", "content": None, "tool_calls": [call("call_1", "get_weather", {"city": "Zürich", "days": 3})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
    ], [WEATHER, SEARCH, EMPTY]),
    ("after the result: an answer and a new question", "both", [
        {"role": "user", "content": "Search cats"},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "search", {"query": "cats", "filters": ["a", "b"], "limit": 2.5})]},
        {"role": "tool", "tool_call_id": "c1", "content": "Cats are small.\nThey purr."},
        {"role": "assistant", "content": "Cats are small and purr."},
        {"role": "user", "content": "And dogs?"},
    ], [SEARCH]),
    ("parallel calls with content, results grouped", "chatml", [
        {"role": "system", "content": "Be precise."},
        {"role": "user", "content": "Paris and Rome"},
        {"role": "assistant", "content": "Checking both.", "tool_calls": [
            call("a", "get_weather", {"city": "Paris"}), call("b", "get_weather", {"city": "Rome", "unit": "celsius"})]},
        {"role": "tool", "tool_call_id": "a", "content": "18"},
        {"role": "tool", "tool_call_id": "b", "content": "24"},
    ], [WEATHER]),
    ("tool turns without tools", "both", [
        {"role": "user", "content": "What time is it?"},
        {"role": "assistant", "content": None, "tool_calls": [call("t", "now", {})]},
        {"role": "tool", "tool_call_id": "t", "content": "12:00"},
    ], None),
]


def main():
    qwen = open(os.path.join(DATA, "qwen2.5.jinja")).read()
    llama = open(os.path.join(DATA, "llama3.1.jinja")).read()
    out = {"generator": "tools/tokref/gen_tool_reference.py, jinja2 " + jinja2.__version__, "cases": []}
    for name, which, messages, tools in CASES:
        for kind, text, bos in (("chatml", qwen, ""), ("llama3", llama, "<|begin_of_text|>")):
            if which not in (None, "both", kind):
                continue
            out["cases"].append({"name": name, "kind": kind,
                                 "template_file": "tests/data/tokenizer/" + ("qwen2.5.jinja" if kind == "chatml" else "llama3.1.jinja"),
                                 "bos_token": bos, "messages": messages, "tools": tools,
                                 "expected": render(text, messages, tools, bos)})
    with open(os.path.join(DATA, "chat_tools_reference.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(len(out["cases"]), "cases")


if __name__ == "__main__":
    main()
