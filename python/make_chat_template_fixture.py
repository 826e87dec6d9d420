#!/usr/bin/env python3
"""Builds tests/data/chat_templates/fixture.json: real chat templates rendered by Hugging Face
transformers over a set of conversations, for tests/unit/chat_template_parity_test.cpp, which
asserts that kiln's Jinja interpreter (src/tokenizer/jinja/) renders every case byte for byte the
same, and raises where transformers raises.

Rendering goes through transformers' own `render_jinja_template` (what
`tokenizer.apply_chat_template(messages, tokenize=False)` calls), with `bos_token` and
`eos_token` passed as apply_chat_template passes them (from the tokenizer's special tokens map),
so no tokenizer download is needed.

The templates (tests/data/chat_templates/<name>.jinja), copied verbatim from:
  llama-3.3-70b-instruct       meta-llama/Llama-3.3-70B-Instruct, as stored in ggerganov/llama.cpp
                               tests/chat/templates/meta-llama-Llama-3.3-70B-Instruct.jinja
                               (commit a4b2d1d0); the Llama 3.1 template with a fixed date_string
  qwen2.5-7b-instruct          Qwen/Qwen2.5-7B-Instruct, ggerganov/llama.cpp
                               tests/chat/templates/Qwen-Qwen2.5-7B-Instruct.jinja (commit eaca756e)
  mistral-7b-instruct-v0.2     mistralai/Mistral-7B-Instruct-v0.2 (original template), wandb/llm-leaderboard
                               chat_templates/mistralai/Mistral-7B-Instruct-v0.2.jinja (commit 3c57e8be)
  mixtral-8x7b-instruct-v0.1   mistralai/Mixtral-8x7B-Instruct-v0.1 (system-message template),
                               ggerganov/llama.cpp tests/chat/templates/mistralai-Mixtral-8x7B-Instruct-v0.1.jinja
                               (commit eaca756e)
  llama-2-7b-chat              meta-llama/Llama-2-7b-chat-hf tokenizer_config.json chat_template, as quoted in
                               b4rtaz/distributed-llama converter/convert-tokenizer-llama2.py (commit 90d7ebd3)
  smollm2-135m-instruct        HuggingFaceTB/SmolLM2-135M-Instruct: `tokenizer.chat_template` of the default
                               model's GGUF (models/SmolLM2-135M-Instruct.Q4_1.gguf), read with the gguf package
  gemma-7b-it                  google/gemma-7b-it, ggerganov/llama.cpp tests/chat/templates/google-gemma-7b-it.jinja
                               (commit 2eb29bf8)
  phi-3-mini-4k-instruct       microsoft/Phi-3-mini-4k-instruct, ggerganov/llama.cpp
                               tests/chat/templates/microsoft-Phi-3-mini-4k-instruct.jinja (commit 8f46558a)
  deepseek-r1-distill-qwen-32b deepseek-ai/DeepSeek-R1-Distill-Qwen-32B, ggml-org/llama.cpp
                               models/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja (commit 20bdc4fa)
  qwen3-0.6b                   Qwen/Qwen3-0.6B, ye-NX/llama.cpp models/templates/Qwen-Qwen3-0.6B.jinja
                               (commit b354d7c9; stored there with CRLF line ends, here with LF, which Jinja
                               reads identically)

Besides the plain conversations (role + content, what kiln's render_chat passes), "variable_cases"
render templates with the full variables transformers passes, tool definitions and tool calls
included, for the Jinja interpreter itself (kiln::jinja::Template).

Usage: /tmp/hfenv/bin/python python/make_chat_template_fixture.py [tests/data/chat_templates]
"""
import json
import os
import sys

import jinja2
import transformers
from transformers.utils.chat_template_utils import _alias_reasoning_fields, render_jinja_template

# name -> (bos_token, eos_token): the special-token strings of each model's tokenizer ("" where
# the tokenizer has none, e.g. Qwen2.5 has no BOS token).
TEMPLATES = {
    "llama-3.3-70b-instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5-7b-instruct": ("", "<|im_end|>"),
    "mistral-7b-instruct-v0.2": ("<s>", "</s>"),
    "mixtral-8x7b-instruct-v0.1": ("<s>", "</s>"),
    "llama-2-7b-chat": ("<s>", "</s>"),
    "smollm2-135m-instruct": ("<|im_start|>", "<|im_end|>"),
    "gemma-7b-it": ("<bos>", "<eos>"),
    "phi-3-mini-4k-instruct": ("<s>", "<|endoftext|>"),
    "deepseek-r1-distill-qwen-32b": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "qwen3-0.6b": ("", "<|im_end|>"),
}


def msg(role, content):
    return {"role": role, "content": content}


# Each conversation is rendered with and without add_generation_prompt.
CONVERSATIONS = {
    "single_user": [msg("user", "Hello!")],
    "system_user": [msg("system", "You are a terse assistant."), msg("user", "What is 2+2?")],
    "multi_turn": [
        msg("user", "Hi"),
        msg("assistant", "Hello! How can I help?"),
        msg("user", "Tell me a joke."),
    ],
    "assistant_last": [msg("user", "Say hi"), msg("assistant", "Hi there.")],
    "system_multi_turn_assistant_last": [
        msg("system", "Answer in French."),
        msg("user", "Good morning"),
        msg("assistant", "Bonjour"),
        msg("user", "Thanks"),
        msg("assistant", "De rien"),
    ],
    "unicode_and_whitespace": [
        msg("system", "  Système: réponds en 中文 😀\n\n"),
        msg("user", "\tÜnïcödé — emoji 👩‍💻 and\r\nCRLF, trailing spaces   \n\n"),
        msg("assistant", "\u3000ideographic space and nbsp\u00a0\n"),
        msg("user", "line one\nline two\n\n  indented line"),
    ],
    "unicode_without_system": [
        msg("user", "  Grüße 👋🏽 ¿qué tal?  \n"),
        msg("assistant", "\n\nÇa va — très bien.\u2003"),
        msg("user", "日本語のテキスト\u3000"),
    ],
    "empty_content": [msg("user", ""), msg("assistant", ""), msg("user", "")],
    "template_syntax_in_content": [
        msg("user", "{{ bos_token }} {% if true %}x{% endif %} {# c #} <|im_end|> [INST] </s>"),
    ],
    "quotes_and_backslashes": [
        msg("user", "He said \"hi\" and 'bye' \\ back\\slash \\n not a newline"),
        msg("assistant", "Think: </think> visible answer"),
        msg("user", "ok"),
    ],
    "system_only": [msg("system", "Only a system prompt.")],
    "consecutive_users": [msg("user", "first"), msg("user", "second")],
    "assistant_first": [msg("assistant", "I start."), msg("user", "Then me.")],
    "long_conversation": [msg("user" if i % 2 == 0 else "assistant", f"turn {i}: " + "word " * (i % 7)) for i in range(24)],
}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city — «quoted» text, unicode 😀",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}
TOOL_CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}
TOOL_CHAT = [
    msg("system", "Use tools when needed."),
    msg("user", "Weather in Zürich?"),
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
    msg("tool", '{"temperature": 21.5, "sky": "clear"}'),
    msg("tool", "second result"),
    msg("assistant", "It is 21.5 °C and clear."),
    msg("user", "Thanks"),
]
# (template, messages, tools, extra template kwargs)
VARIABLE_CASES = [
    ("qwen2.5-7b-instruct", TOOL_CHAT, [WEATHER_TOOL], {}),
    ("qwen2.5-7b-instruct", TOOL_CHAT[1:], [WEATHER_TOOL], {}),
    ("qwen3-0.6b", TOOL_CHAT, [WEATHER_TOOL], {}),
    ("qwen3-0.6b", [msg("user", "2+2?"), {"role": "assistant", "content": "4", "reasoning_content": "\nadd them\n"},
                    msg("user", "3+3?")], None, {"enable_thinking": False}),
    ("qwen3-0.6b", [msg("user", "hi"), msg("assistant", "<think>\nhmm\n</think>\n\nhello")], None, {}),
    ("llama-3.3-70b-instruct", TOOL_CHAT[1:], [WEATHER_TOOL], {}),
    ("llama-3.3-70b-instruct", TOOL_CHAT, [WEATHER_TOOL], {"tools_in_user_message": False, "date_string": "1 Jan 2025"}),
    ("llama-3.3-70b-instruct", [msg("user", "run it"), {"role": "assistant", "tool_calls": [
        {"function": {"name": "brave_search", "arguments": {"query": "kiln"}}}]}],
     None, {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}),
    ("llama-3.3-70b-instruct", [msg("user", "two calls"), {"role": "assistant", "tool_calls": [TOOL_CALL, TOOL_CALL]}],
     None, {}),
    ("deepseek-r1-distill-qwen-32b", [msg("user", "Weather?"), {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        msg("tool", "cold"), msg("assistant", "<think>\nok\n</think>It is cold.")], None, {}),
]


def render(template, messages, add_generation_prompt, bos, eos):
    rendered, _ = render_jinja_template(
        conversations=[messages],
        chat_template=template,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos,
        eos_token=eos,
    )
    return rendered[0]


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "chat_templates")
    cases = []
    for name, (bos, eos) in TEMPLATES.items():
        with open(os.path.join(out_dir, name + ".jinja"), encoding="utf-8", newline="") as f:
            template = f.read()
        for conv_name, messages in CONVERSATIONS.items():
            for agp in (False, True):
                case = {"template": name, "conversation": conv_name, "messages": messages,
                        "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos}
                try:
                    case["expected"] = render(template, messages, agp, bos, eos)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)  # raise_exception(...) in the template
                cases.append(case)
    variable_cases = []
    for name, messages, tools, extra in VARIABLE_CASES:
        bos, eos = TEMPLATES[name]
        with open(os.path.join(out_dir, name + ".jinja"), encoding="utf-8", newline="") as f:
            template = f.read()
        # What apply_chat_template does to messages before render_jinja_template (drop None values)
        # and what render_jinja_template does to them (alias reasoning fields) -> what the template sees.
        messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
        for agp in (False, True):
            variables = {"messages": _alias_reasoning_fields(messages), "tools": tools, "documents": None,
                         "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos, **extra}
            case = {"template": name, "variables": variables}
            try:
                case["expected"], _ = render_jinja_template(
                    conversations=[messages], tools=tools, chat_template=template, add_generation_prompt=agp,
                    bos_token=bos, eos_token=eos, **extra)
                case["expected"] = case["expected"][0]
            except jinja2.exceptions.TemplateError as e:
                case["error"] = str(e)
            variable_cases.append(case)
    fixture = {
        "generator": f"python/make_chat_template_fixture.py with transformers {transformers.__version__}, "
                     f"jinja2 {jinja2.__version__}",
        "cases": cases,
        "variable_cases": variable_cases,
    }
    path = os.path.join(out_dir, "fixture.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in cases)
    print(f"wrote {path}: {len(cases)} cases ({errors} raise) over {len(TEMPLATES)} templates, "
          f"{len(variable_cases)} cases with tools")


if __name__ == "__main__":
    main()
