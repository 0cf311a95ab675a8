#!/usr/bin/env python3
"""Writes tests/golden/chat_templates/: what transformers' apply_chat_template renders for real chat
templates on a set of conversations; tests/unit/test_chat_template.cpp checks refit's template
engine (plugins/text/jinja.h, chat_template.h) against it, byte for byte.

    source scripts/env.sh                      # REFIT_SMOLLM2_GGUF: SmolLM2-135M-Instruct's GGUF
    ~/.cache/refit/torch-2.11.0/bin/python tests/golden/make_chat_templates.py

No model hub: SmolLM2's template is read from the GGUF (`tokenizer.chat_template`), and its
tokenizer (transformers' GGUF loader) tokenizes every rendered text; the other templates are the
public strings below, verbatim from llama.cpp (tests/test-chat-template.cpp and
models/templates/*.jinja, which copy the models' tokenizer_config.json) and from Qwen2.5's
tokenizer_config.json as quoted by other projects' tests.

Output:
  templates.json  {name: {text, source, bos_token, eos_token, end_of_turn, extra}}; <name>.jinja
                  the same texts, readable (and the fuzzer's seeds)
  conversations.jsonl  chat JSONL records {"messages": [...]}, one a line
  cases.jsonl     {"meta"} then one record per (template, conversation index, add_generation_prompt):
                  text (apply_chat_template(tokenize=False)), ids (tokenize=True, SmolLM2's
                  tokenizer), spans [[message, begin, end]] in UTF-8 bytes (assistant content +
                  end-of-turn marker; found here by rendering prefixes of the conversation, a
                  different method from the C++ one), assistant_mask / last_mask (a
                  character per token, 1 where it overlaps the spans: transformers' rule); or "raises": the template's message.
  snippets.jsonl  small templates, one construct each, and jinja's output for them
  random.jsonl    random templates from the grammar and jinja's output or error (differential)
  errors.jsonl    templates jinja renders but the engine must refuse (line, column, message), and
                  templates jinja itself rejects.
"""

# The package versions that produced this script's fixtures (the pinned interpreter
# ~/.cache/refit/torch-2.11.0/bin/python, CONTRIBUTING.md). Another version is refused before
# anything is computed: its results may differ, and the fixtures name these versions.
PINNED = {"transformers": "5.24.0", "jinja2": "3.1.6", "tokenizers": "0.23.3", "gguf": "0.19.0"}

import pinned  # noqa: E402 (tests/golden/pinned.py, beside this script)

pinned.require(__file__, PINNED)

import json
import os
import random
import sys
from pathlib import Path

import gguf
import jinja2
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

OUT = Path(__file__).resolve().parent / "chat_templates"
SEED = 33

# ---- the templates -------------------------------------------------------------------------------

# Qwen/Qwen2.5-*-Instruct (ChatML; a default system prompt when the conversation has none).
QWEN25 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# meta-llama/Meta-Llama-3-8B-Instruct.
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
          "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# meta-llama/Llama-3.2-3B-Instruct (llama.cpp models/templates): 3.1's layout, the date from
# strftime_now unless date_string is given, tools in the first user message.
LLAMA32 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

# mistralai/Mistral-7B-Instruct-v0.2 (llama.cpp tests/test-chat-template.cpp): user/assistant only,
# strictly alternating, else raise_exception.
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

# mistralai/Mistral-Nemo-Instruct-2407 (llama.cpp models/templates): the system message goes into
# the last user turn; selectattr, namespace(), tools.
MISTRAL_NEMO = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS][" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST]" + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST]" + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}
        {{- "[TOOL_CALLS][" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- message["content"] + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS]{"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""


def gguf_chat_template(path):
    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def templates(smollm2_template):
    llama_extra = {"date_string": "26 Jul 2024"}  # strftime_now would put today's date in the golden text
    return {
        "smollm2": {"text": smollm2_template, "source": "SmolLM2-135M-Instruct.Q4_1.gguf tokenizer.chat_template",
                    "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "end_of_turn": "<|im_end|>", "extra": {}},
        "qwen2.5": {"text": QWEN25, "source": "Qwen/Qwen2.5-Instruct tokenizer_config.json chat_template",
                    "bos_token": "", "eos_token": "<|im_end|>", "end_of_turn": "<|im_end|>", "extra": {}},
        "llama3": {"text": LLAMA3, "source": "meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json chat_template",
                   "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "end_of_turn": "<|eot_id|>", "extra": {}},
        "llama3.2": {"text": LLAMA32, "source": "llama.cpp models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja",
                     "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "end_of_turn": "<|eot_id|>",
                     "extra": llama_extra},
        "mistral": {"text": MISTRAL, "source": "mistralai/Mistral-7B-Instruct-v0.2 (llama.cpp tests/test-chat-template.cpp)",
                    "bos_token": "<s>", "eos_token": "</s>", "end_of_turn": "</s>", "extra": {}},
        "mistral-nemo": {"text": MISTRAL_NEMO, "source": "llama.cpp models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja",
                         "bos_token": "<s>", "eos_token": "</s>", "end_of_turn": "</s>", "extra": {}},
    }


# ---- the conversations ---------------------------------------------------------------------------

CONTENTS = [
    "Hello", "Hi there", "What is the capital of France?", "Paris.", "", " ", "  padded both sides  ",
    "line one\nline two\n\nline four", "\nstarts with a newline", "ends with a newline\n", "tabs\tand\ttabs",
    "Café, naïve, résumé — “quotes” …", "你好，世界！今天天气怎么样？", "日本語のテキスト", "Привет, мир", "مرحبا بالعالم",
    "Emoji 😀👍🏽 👨‍👩‍👧 🇩🇪", "math: ∑ x² ≤ ∞, ½", "code: def f(x):\n    return {'k': [x ** 2]}",
    "{{ not a template }} {% neither %}", "<|im_end|> inside content", "</s> and [INST] lookalikes",
    "CRLF\r\nline", "trailing spaces   ", "a" * 120, "Mixed 123 numbers 4.5e6 and 0x1F", "'single' and \"double\" quotes",
    "back\\slash \\n not a newline", "\u00a0nbsp\u3000ideographic space\u2028line separator",
]


def conversations(rng):
    """Varied conversations: with and without a system message, one to five exchanges, empty and
    whitespace-only contents, unicode, newlines; a few break the user/assistant alternation."""
    out = []
    systems = ["You are a helpful assistant.", "Answer in French.", "  Be brief.  \n", "Ты полезный помощник. 🤖", ""]
    for n in range(56):
        msgs = []
        if n % 3 == 0:
            msgs.append({"role": "system", "content": systems[n % len(systems)]})
        exchanges = 1 + n % 5
        for k in range(exchanges):
            msgs.append({"role": "user", "content": rng.choice(CONTENTS)})
            if k < exchanges - 1 or n % 2 == 0:  # odd n end with a user turn (a prompt)
                msgs.append({"role": "assistant", "content": rng.choice(CONTENTS)})
        out.append(msgs)
    # Orders some templates refuse (Mistral raises), others render.
    out.append([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
    out.append([{"role": "assistant", "content": "I speak first"}, {"role": "user", "content": "ok"}])
    out.append([{"role": "system", "content": "sys"}, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}])
    out.append([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "system", "content": "late system"},
                {"role": "user", "content": "q2"}])
    return out


# ---- rendering -----------------------------------------------------------------------------------

def render(t, msgs, gen):
    return render_jinja_template(conversations=[msgs], chat_template=t["text"], add_generation_prompt=gen,
                                 bos_token=t["bos_token"], eos_token=t["eos_token"], **t["extra"])[0][0]


def utf8_offset(text, char_index):
    return len(text[:char_index].encode("utf-8"))


def spans_by_prefixes(t, msgs, full):
    """Each assistant turn from prefixes of the conversation: render(msgs[:i], generation prompt)
    must be a prefix of render(msgs[:i+1]), itself a prefix of the whole; the turn is what message
    i adds, up to and including its last end-of-turn marker. None when a template breaks the
    prefix property (Mistral-Nemo moves the system message into the last user turn)."""
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        try:
            before = render(t, msgs[:i], True)
            upto = render(t, msgs[: i + 1], False)
        except (jinja2.exceptions.TemplateError, IndexError):
            return None  # e.g. messages[0] of an empty conversation
        if not (upto.startswith(before) and full.startswith(upto)):
            return None
        added = upto[len(before):]
        end = added.rfind(t["end_of_turn"])
        if end < 0:
            return None
        end += len(t["end_of_turn"])
        spans.append([i, utf8_offset(full, len(before)), utf8_offset(full, len(before) + end)])
    return spans


def mask(encoding, text, spans):
    """One character per token, "1" where it overlaps a span (a string keeps the fixture small)."""
    out = ""
    for start, end in encoding["offset_mapping"]:
        b, e = utf8_offset(text, start), utf8_offset(text, end)
        out += "1" if any(e > s[1] and b < s[2] for s in spans) else "0"
    return out


# ---- snippets: the language, one construct at a time -----------------------------------------------

# Rendered by transformers' jinja environment with SNIPPET_VARS; the engine must give the same
# bytes. Whitespace control, Python's str()/repr(), arithmetic, scoping, loops, filters, tests.
SNIPPET_VARS = {"ms": [{"role": "user", "content": " a "}, {"role": "assistant", "content": "b"}],
                "d": {"k": 1, "x": [1, 2], "s": "t"}, "s": "héllo wörld", "n": None, "e": "", "f": 2.5, "i": 7,
                "l": [3, 1, 2], "b": True, "neg": -3}
SNIPPETS = [
    "a\n  {% if true %}\n  b\n  {% endif %}\nc\n",
    "{% if true %}  x  {% endif %}",
    "{#- c -#}  {% if true -%}  x  {%- endif %}  y",
    "  {%+ if true %}kept{% endif %}\n{% if true +%}\nnewline kept{% endif %}",
    "{% for i in range(3) %}\n  {{ i }}\n{% endfor %}\n",
    "{{ 'x' }}\n{{ 'y' -}}\n\n  z {{- ' w' }}",
    "line\r\nwindows\rold mac\n\n",
    "  {# comment #}\nafter",
    "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}",
    "{% for i in range(3) %}{% if i == 0 %}{% set y = 5 %}{% endif %}{{ y }}{% endfor %}",
    "{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}",
    "{% set ns = namespace(x=1) %}{% for i in range(3) %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}",
    "{{ [1, 'a', None, True, 1.0, {'k': \"it's\"}] }}",
    "{{ u ~ 'a' }}{{ u }}|{{ d.missing }}|{{ n.x }}|{{ ms[5] }}|{{ ms[-1].role }}",
    "{{ 7 % -3 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 4 / 2 }} {{ -1 ** 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
    "{{ 1 == 1.0 }} {{ True == 1 }} {{ 'a' < 'b' }} {{ 1 < 2 < 3 }} {{ not 1 == 2 }} {{ 2 * 3 + 1 }}",
    "{{ 'abc'[::-1] }} {{ [1, 2, 3][1:] }} {{ s[1:3] }} {{ s | length }} {{ s[-1] }} {{ s[::2] }} {{ [1,2,3,4][-3:-1] }}",
    "{{ d | tojson }} {{ ms | tojson }} {{ 'a\"\\n\u00e9\x7f' | tojson }} {{ s | tojson(ensure_ascii=true) }}",
    "{{ d | tojson(indent=2) }}{{ {} | tojson(indent=2) }}{{ d | tojson(separators=(',', ':'), sort_keys=true) }}",
    "{% for a in [] %}x{% else %}empty{% endfor %}",
    "{{ 1.0 }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 3.0 * 2 }} {{ 1e-5 }} {{ 0.0001 }} {{ 123456789.125 }} {{ -0.0 }} {{ f }}",
    "{{ 'x' * 3 }} {{ [1] * 2 }} {{ none }} {{ None }} {{ true }} {{ True }} {{ (1, 2) }} {{ (1,) }} {{ () }} {{ 1, 2 }}",
    "{% for m in ms %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{% endfor %}",
    "{% for m in ms %}{{ loop.previtem is defined }}{{ loop.cycle('a', 'b') }}{{ loop.nextitem is defined }}{% endfor %}",
    "{% if x is defined %}d{% endif %}{{ x is none }}{{ n is none }}{{ e is string }}{{ d is mapping }}{{ ms is iterable }}",
    "{{ 'abc' is sequence }}{{ 1 is number }}{{ true is number }}{{ 2 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 1 is eq 1 }}",
    "{{ 'a' in 'cat' }} {{ 'k' in d }} {{ 1 in [1] }} {{ 'a' not in 'b' }} {{ 'user' in ms | map(attribute='role') | list }}",
    "{{ ms | selectattr('role', 'equalto', 'user') | list }} {{ ms | rejectattr('role', 'equalto', 'user') | list }}",
    "{{ ms | map(attribute='role') | join(',') }} {{ [1, 2, 3] | select('odd') | list }} {{ ['a', 'code_interpreter'] | reject('equalto', 'code_interpreter') | join(', ') }}",
    "{{ 'ab' | list }} {{ d | items | list }} {{ 'x' 'y' }} {{ 1 if false }}| {{ 'a' if n else 'b' }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
    "{% for x in [1, 2, 3] if x > 1 %}{{ loop.index }}{{ x }}{{ loop.length }}{% endfor %}",
    "{{ 'a' ~ 1 ~ none ~ true ~ 1.5 }} {{ 'a' + 'b' | upper }} {{ -3 | abs }} {{ '3' | int + 1 }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 'x' | string }}",
    "{{ ms[0].content | trim }}|{{ ms[0]['content'].strip() }}|{{ '  x'.lstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ ' a b  c '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}",
    "{{ x | default('d') }}{{ n | default('d') }}{{ n | default('d', true) }}{{ e | d('e', true) }}",
    "{{ [3, 1, 2] | sort }}{{ 'aXb' | replace('X', 'y') }}{{ 'hello wORLD' | title }}{{ 'hELLO' | capitalize }}{{ [1, 2] | first }}{{ [1, 2] | last }}{{ s | upper }}{{ 'ÀÉ' | lower }}",
    "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{{ \"\\u00e9\\x41\\101\\q\\t|\" }}{{ '\\'' }}{{ \"\\\"\" }}",
    "{{ s.startswith('hé') }}{{ s.endswith(('x', 'ld')) }}{{ s.upper() }}{{ s.title() }}{{ s.replace('l', 'L', 2) }}{{ ', '.join(['a', 'b']) }}{{ d.get('k') }}{{ d.get('z', 0) }}{{ d.keys() | list }}",
    "{{ ['b', 'a', 'B'] | sort }}{{ [1, 2, 2, 1] | unique | list }}{{ [3, 1, 2] | max }}{{ [3, 1, 2] | min }}{{ [1, 2, 3] | sum }}{{ [1, 2] | reverse | list }}{{ 'abc' | reverse }}",
    "{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]",
    "{{ 'ß' | upper }}{{ 'Σ' | lower }}{{ 'ǆ' | title }}{{ 'ﬁx' | capitalize }}{{ 'İ' | lower | length }}",
    "{{ 10 // 3 }} {{ -10 // 3 }} {{ 10 % -3 }} {{ 2 ** -1 }} {{ 1 / 3 }} {{ 2 ** 62 }} {{ 0x1F }} {{ 0b101 }} {{ 0o17 }} {{ 1_000 }} {{ 1.5e3 }}",
    "{{ {'a': [1, {'b': none}], 'c': 'd\\'e'} }} {{ ['\\n', '\\x01', 'é', '\\u2028'] }}",
    "{{ ns }}{% set ns = 3 %}{{ ns }}",
]


def snippets():
    out = []
    for t in SNIPPETS:
        out.append({"template": t, "text": _compile_jinja_template(t).render(**SNIPPET_VARS)})
    return out

# ---- random templates: a differential test -------------------------------------------------------

# Expressions and statements drawn from the grammar (literals, the snippet variables, operators,
# filters, tests, methods, conditionals; if/for/set/comments under every whitespace control).
# jinja's output, or its error, for each; the engine must give the same output, refuse (an
# error), or fail where jinja fails: never a different text.
LITS = ["1", "0", "-2", "2.5", "0.1", "'a'", "'xY z'", "''", "true", "false", "none", "[1, 2]", "[]", "{'a': 1}", "(1, 'x')", "'  pad '", "'é'", "1e3", "10"]
NAMES = ["ms", "d", "s", "n", "e", "f", "i", "l", "b", "neg", "undefined_x", "ms[0]", "ms[-1]", "d.k", "d['x']", "ms[0].content", "d.s", "l[1:]", "s[::-1]", "s[2]", "ms|length"]
BIN = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or"]
FILTERS = ["trim", "length", "tojson", "upper", "lower", "title", "capitalize", "string", "list", "first", "last", "reverse", "abs", "int", "float", "default('D')", "default('D', true)", "join('-')", "sort", "unique", "max", "min", "sum", "items", "round", "replace('l', 'L')", "tojson(indent=2)", "selectattr('role', 'equalto', 'user')", "map(attribute='role')", "select('odd')", "reject('none')", "count", "safe", "trim('x')"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence", "boolean", "true", "false", "odd", "even", "divisibleby 2", "equalto 1", "eq 'a'", "lower", "upper", "in [1, 'a']", "ne 2", "gt 1", "lessthan 3", "sameas none"]
METHODS = [".strip()", ".upper()", ".lower()", ".title()", ".split()", ".split(' ')", ".startswith('h')", ".endswith('d')", ".replace('o', '0')", ".items()", ".keys()", ".values()", ".get('k')", ".get('z', 5)", ".lstrip('h')", ".capitalize()"]
def random_expression(rng, depth=0):
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice(LITS + NAMES)
    if r < 0.5:
        return "(" + random_expression(rng, depth + 1) + " " + rng.choice(BIN) + " " + random_expression(rng, depth + 1) + ")"
    if r < 0.65:
        return random_expression(rng, depth + 1) + " | " + rng.choice(FILTERS)
    if r < 0.75:
        return "(" + random_expression(rng, depth + 1) + " is " + rng.choice(["", "not "]) + rng.choice(TESTS) + ")"
    if r < 0.85:
        return "(" + rng.choice(NAMES + LITS) + ")" + rng.choice(METHODS)
    if r < 0.9:
        return "(" + random_expression(rng, depth + 1) + " if " + random_expression(rng, depth + 1) + " else " + random_expression(rng, depth + 1) + ")"
    if r < 0.95:
        return "not " + random_expression(rng, depth + 1)
    return "[" + random_expression(rng, depth + 1) + ", " + random_expression(rng, depth + 1) + "]"
WS = ["", " ", "\n", "  \n  ", "\t", "\n\n"]
def random_template(rng):
    r = rng.random()
    if r < 0.6:
        return "{{ " + random_expression(rng) + " }}"
    parts = []
    for _ in range(rng.randint(1, 4)):
        k = rng.random()
        lm, rm = rng.choice(["", "-", "+"]), rng.choice(["", "-", "+"])
        w1, w2, w3 = rng.choice(WS), rng.choice(WS), rng.choice(WS)
        if k < 0.3:
            parts.append(f"{w1}{{%{lm} if {random_expression(rng, 2)} {rm}%}}{w2}x{w3}{{%{lm} else {rm}%}}{w2}y{{% endif %}}{w3}")
        elif k < 0.6:
            parts.append(f"{w1}{{%{lm} for v in {rng.choice(['l', 'ms', 's', 'd', 'range(3)', 'l|reverse'])} {rm}%}}{w2}{{{{ loop.index }}}}{{{{ v }}}}{w3}{{% endfor {rm}%}}{w1}")
        elif k < 0.8:
            parts.append(f"{w1}{{%{lm} set q = {random_expression(rng, 2)} {rm}%}}{w2}{{{{ q }}}}{w3}")
        else:
            parts.append(f"{w1}{{#{lm} c {rm}#}}{w2}{{{{{lm} {random_expression(rng, 2)} {rm}}}}}{w3}")
    return "".join(parts)


ITERABLES = ["ms", "d.items()", "l", "range(2)", "d|items", "ms|selectattr('role', 'equalto', 'user')", "s"]


def random_statements(rng, depth=0):
    """Nested for/if/elif/set, namespace updates, comments and loop variables: jinja's scoping."""
    k = rng.random()
    lm, rm = rng.choice(["", "-", "+", ""]), rng.choice(["", "-", "+", ""])

    def w():
        return rng.choice(WS + ["", "", "  "])
    if depth > 2 or k < 0.25:
        return w() + "{{" + lm + " " + random_expression(rng, 2) + " " + rm + "}}" + w()
    if k < 0.45:
        target = rng.choice(["v", "k, v", "m"])
        cond = rng.choice(["", " if loop is defined", " if v"])
        return (f"{w()}{{%{lm} for {target} in {rng.choice(ITERABLES)}{cond} {rm}%}}{w()}{random_statements(rng, depth + 1)}"
                f"{{% if loop.last %}}L{{% endif %}}{{{{ loop.index0 }}}}{w()}{{%{lm} endfor {rm}%}}{w()}")
    if k < 0.6:
        return (f"{w()}{{%{lm} if {random_expression(rng, 2)} {rm}%}}{random_statements(rng, depth + 1)}"
                f"{{%{lm} elif {random_expression(rng, 2)} {rm}%}}{random_statements(rng, depth + 1)}{{% else %}}"
                f"{random_statements(rng, depth + 1)}{{%{lm} endif {rm}%}}{w()}")
    if k < 0.75:
        target = rng.choice(["q", "ns.c", "v"])
        return (f"{w()}{{%{lm} set {target} = {random_expression(rng, 2)} {rm}%}}{w()}{random_statements(rng, depth + 1)}"
                "{{ q }}{{ ns.c }}")
    if k < 0.85:
        return f"{{# x #}}{w()}{{%- set ns.c = ns.c ~ 'y' %}}{random_statements(rng, depth + 1)}"
    return random_statements(rng, depth + 1) + random_statements(rng, depth + 1)


def random_cases(n):
    rng = random.Random(SEED + 1)
    out = []
    for j in range(n):
        t = random_template(rng) if j % 3 else "{% set ns = namespace(c='') %}" + random_statements(rng) + "{{ ns.c }}"
        try:
            text = _compile_jinja_template(t).render(**SNIPPET_VARS)
        except Exception as e:  # noqa: BLE001 (any jinja failure: the engine must fail too)
            out.append({"template": t, "error": f"{type(e).__name__}: {e}"})
            continue
        if " at 0x" in text:  # an object's address (a generator printed): not reproducible
            continue
        out.append({"template": t, "text": text})
    return out


# ---- templates the engine must refuse, and ones jinja rejects ------------------------------------

# (template, the text at the error's position, message fragment). Each renders in jinja (checked
# below): the engine refuses what it does not implement instead of approximating it.
REFUSED = [
    ("{% macro greet(n) %}hi {{ n }}{% endmacro %}{{ greet('x') }}", "macro", "unsupported statement 'macro'"),
    ("a\n{% filter upper %}x{% endfilter %}", "filter", "unsupported statement 'filter'"),
    ("{% for m in messages %}\n  {{ m.content | wordcount }}\n{% endfor %}", "wordcount", "unsupported filter 'wordcount'"),
    ("{{ messages | groupby('role') }}", "groupby", "unsupported filter 'groupby'"),
    ("{{ 'x' | indent(2) }}", "indent", "unsupported filter 'indent'"),
    ("{{ raise_exception is callable }}", "callable", "unsupported test 'callable'"),
    ("{% raw %}{{ x }}{% endraw %}", "{% raw", "unsupported: {% raw %} blocks"),
    ("{% for m in messages recursive %}{{ m.role }}{% endfor %}", "recursive", "unsupported: recursive for loops"),
    ("{% with x = 1 %}{{ x }}{% endwith %}", "with", "unsupported statement 'with'"),
    ("{{ '%s!' % 'hi' }}", "% 'hi'", "unsupported: printf-style string formatting"),
    ("{{ 'a,b'.format(1) }}", "(", "unsupported method str.format()"),
    ("{{ messages[0].items }}", ".items", "the dict method 'items' used as a value is not supported"),
    ("{{ 2 ** 64 }}", "**", "integer overflow"),
    ("{{ lipsum() }}", "(", "unsupported function 'lipsum'"),
    ("{% set x = {'a': 1} %}{{ x.pop('a') }}", "(", "unsupported method dict.pop()"),
    ("{{ namespace }}", "namespace", "printing a function object"),
]

# Not Jinja at all: jinja2 raises TemplateSyntaxError too.
SYNTAX = [
    ("{% frobnicate %}", "frobnicate", "unknown statement 'frobnicate'"),
    ("{{ messages | nosuchfilter }}", "nosuchfilter", "no filter named 'nosuchfilter'"),
    ("{% if x %}never closed", "", "unexpected end of template"),
    ("{{ x ", "", "unexpected end of template"),
    ("{{ (1, 2 }}", "}}", "unexpected '}', expected ')'"),
    ("{% for x in %}{% endfor %}", "%}", "expected an expression"),
    ("{# no end", "{#", "missing end of comment tag"),
    ("{{ x is nosuchtest }}", "nosuchtest", "no test named 'nosuchtest'"),
]


def position(template, marker):
    index = template.index(marker) if marker else len(template.rstrip("\n"))
    before = template[:index]
    return before.count("\n") + 1, index - (before.rfind("\n") + 1) + 1


def main():
    gguf_path = os.environ.get("REFIT_SMOLLM2_GGUF")
    if not gguf_path or not os.path.isfile(gguf_path):
        sys.exit("REFIT_SMOLLM2_GGUF is not set to SmolLM2-135M-Instruct.Q4_1.gguf: source scripts/env.sh")
    rng = random.Random(SEED)
    smollm2_text = gguf_chat_template(gguf_path)
    temps = templates(smollm2_text)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    convs = conversations(rng)

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "templates.json").write_text(json.dumps(temps, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    for name, t in temps.items():  # readable copies (and the fuzzer's seeds)
        (OUT / f"{name}.jinja").write_text(t["text"], encoding="utf-8")
    with open(OUT / "conversations.jsonl", "w", encoding="utf-8") as f:
        for msgs in convs:
            f.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
    n_rendered = n_raised = n_spans = 0
    with open(OUT / "cases.jsonl", "w", encoding="utf-8") as f:
        meta = {"meta": {"generator": "tests/golden/make_chat_templates.py", "versions": PINNED, "seed": SEED,
                         "tokenizer": os.path.basename(gguf_path), "conversations": len(convs)}}
        f.write(json.dumps(meta) + "\n")
        for name, t in temps.items():
            for ci, msgs in enumerate(convs):
                for gen in ([False, True] if msgs[-1]["role"] == "user" else [False]):
                    rec = {"template": name, "conversation": ci, "add_generation_prompt": gen}
                    try:
                        text = render(t, msgs, gen)
                    except jinja2.exceptions.TemplateError as e:
                        rec["raises"] = str(e)
                        n_raised += 1
                        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                        continue
                    # The same through apply_chat_template on SmolLM2's tokenizer (its special tokens
                    # overridden by the template's): text, then ids.
                    kwargs = dict(chat_template=t["text"], add_generation_prompt=gen, bos_token=t["bos_token"],
                                  eos_token=t["eos_token"], **t["extra"])
                    assert tok.apply_chat_template(msgs, tokenize=False, **kwargs) == text, (name, ci)
                    ids = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, **kwargs)["input_ids"]
                    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
                    assert enc["input_ids"] == ids, (name, ci)
                    rec.update(text=text, ids=ids)
                    if not gen:
                        spans = spans_by_prefixes(t, msgs, text)
                        if spans is not None:
                            rec["spans"] = spans
                            rec["assistant_mask"] = mask(enc, text, spans)
                            rec["last_mask"] = mask(enc, text, spans[-1:])
                            n_spans += 1
                    n_rendered += 1
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    with open(OUT / "snippets.jsonl", "w", encoding="utf-8") as f:
        f.write(json.dumps({"meta": {"variables": SNIPPET_VARS}}, ensure_ascii=False) + "\n")
        for rec in snippets():
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    randoms = random_cases(1500)
    with open(OUT / "random.jsonl", "w", encoding="utf-8") as f:
        for rec in randoms:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    with open(OUT / "errors.jsonl", "w", encoding="utf-8") as f:
        for template, marker, message in REFUSED:
            c = _compile_jinja_template(template)  # jinja takes it: the refusal is the engine's
            try:
                c.render(messages=[{"role": "user", "content": "hi"}], x=1)
            except (jinja2.exceptions.TemplateError, OverflowError):
                pass  # a runtime error in jinja is fine (e.g. lipsum is not callable in the sandbox)
            line, column = position(template, marker)
            f.write(json.dumps({"template": template, "line": line, "column": column, "message": message,
                                "jinja": "accepts"}) + "\n")
        for template, marker, message in SYNTAX:
            try:
                _compile_jinja_template(template)
                raise SystemExit(f"jinja accepted {template!r}")
            except jinja2.exceptions.TemplateSyntaxError as e:
                jinja_line = e.lineno
            line, column = position(template, marker)
            assert line == jinja_line, (template, line, jinja_line)
            f.write(json.dumps({"template": template, "line": line, "column": column, "message": message,
                                "jinja": "rejects"}) + "\n")
    print(f"{OUT}: {len(temps)} templates x {len(convs)} conversations: {n_rendered} rendered "
          f"({n_spans} with assistant spans), {n_raised} raise; "
          f"{len(SNIPPETS)} snippets, {len(randoms)} random templates; {len(REFUSED)} refused and {len(SYNTAX)} syntax-error templates")


if __name__ == "__main__":
    main()
