#!/usr/bin/env python3
"""Renders tool conversations with the official Qwen2.5-Instruct, Llama 3.1-Instruct and
Mistral-7B-Instruct-v0.3 chat templates (tests/data/tokenizer/qwen2.5.jinja, llama3.1.jinja,
mistral-v0.3.jinja) the way Hugging Face
transformers' apply_chat_template does -- jinja2 with trim_blocks, lstrip_blocks, the
loopcontrols extension and transformers' own `tojson` (json.dumps, ensure_ascii=False) --
and writes tests/data/tokenizer/chat_tools_reference.json for src/tokenizer/chat_tools_test.cc.

Messages are stored in the OpenAI wire format (a tool call's `arguments` is a JSON text);
as vLLM and llama.cpp do, the arguments are parsed into a mapping before rendering.
Mistral's template raises on a call id that is not 9 characters long; its cases hold the ids
a client sends, and the template is given them as Attic documents it renders them
(mistral_id below: 9 alphanumerics kept, any other id mapped to 9 alphanumerics by FNV-1a).
The Mistral family renders plain chats through the same template, so its cases include some
without tools.
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


def mistral_id(id_):
    """9 alphanumerics as they are; else base 62 of the id's 64-bit FNV-1a, low digit first."""
    if len(id_) == 9 and id_.isascii() and id_.isalnum():
        return id_
    h = 0xcbf29ce484222325
    for b in id_.encode("utf-8"):
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out = ""
    for _ in range(9):
        out += digits[h % 62]
        h //= 62
    return out


def render(template_text, messages, tools, bos_token, eos_token="", map_ids=None):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    hf_messages = copy.deepcopy(messages)
    for m in hf_messages:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
            if map_ids:
                c["id"] = map_ids(c["id"])
        if map_ids and "tool_call_id" in m:
            m["tool_call_id"] = map_ids(m["tool_call_id"])
        if m.get("tool_calls") is None:
            m.pop("tool_calls", None)  # an assistant turn without calls: no key, as clients send it
    kwargs = dict(messages=hf_messages, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token)
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
    # Mistral only: 9-character ids (kept), the system prompt joined to a last user turn, the
    # tools before the last user turn (and before an earlier one equal to it), "return" left
    # out of a tool definition, OpenAI-style ids, and plain chats.
    ("Mistral: the system prompt and the tools go with the last user turn", "mistral", [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call("a1B2c3D4e", "get_weather", {"city": "Oslo"})]},
        {"role": "tool", "tool_call_id": "a1B2c3D4e", "content": "{\"temp\": -3}"},
        {"role": "assistant", "content": " It is -3 degrees. "},
        {"role": "user", "content": "Weather?"},
    ], [WEATHER, {"type": "function", "function": {"name": "now", "return": {"type": "string"}, "parameters": {"type": "object", "properties": {}}}}]),
    ("Mistral: OpenAI-style ids, parallel calls", "mistral", [
        {"role": "user", "content": "Paris and Rome, then search"},
        {"role": "assistant", "content": "", "tool_calls": [
            call("call_9f2c1a7e5b3d4c8e", "get_weather", {"city": "Paris"}), call("call_Zx", "search", {"query": "Rome"})]},
        {"role": "tool", "tool_call_id": "call_9f2c1a7e5b3d4c8e", "content": "18"},
        {"role": "tool", "tool_call_id": "call_Zx", "content": "Rome is warm."},
        {"role": "assistant", "content": "Paris 18."},
        {"role": "user", "content": "Thanks"},
    ], [WEATHER, SEARCH]),
    ("Mistral: a plain chat", "mistral", [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": " Hi "},
        {"role": "assistant", "content": "Hello!\n"},
        {"role": "user", "content": "How are you?"},
    ], None),
    ("Mistral: one user turn", "mistral", [{"role": "user", "content": "Once upon a time"}], None),
]

KINDS = [  # kind, template file, bos, eos, how ids reach the template
    ("chatml", "qwen2.5.jinja", "", "", None),
    ("llama3", "llama3.1.jinja", "<|begin_of_text|>", "", None),
    ("mistral", "mistral-v0.3.jinja", "<s>", "</s>", mistral_id),
]


def main():
    out = {"generator": "tools/tokref/gen_tool_reference.py, jinja2 " + jinja2.__version__, "cases": []}
    for name, which, messages, tools in CASES:
        for kind, file, bos, eos, map_ids in KINDS:
            # None: every family; "both": ChatML and Llama-3 -- and Mistral, whose template
            # takes whatever they take; else the one family named.
            if which not in (None, "both", kind) and not (which == "chatml" and kind == "mistral"):
                continue
            text = open(os.path.join(DATA, file)).read()
            case = {"name": name, "kind": kind, "template_file": "tests/data/tokenizer/" + file,
                    "bos_token": bos, "messages": messages, "tools": tools,
                    "expected": render(text, messages, tools, bos, eos, map_ids)}
            if eos:
                case["eos_token"] = eos
            out["cases"].append(case)
    with open(os.path.join(DATA, "chat_tools_reference.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(len(out["cases"]), "cases")


if __name__ == "__main__":
    main()
