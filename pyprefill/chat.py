"""Chat: a GGUF's chat template rendered as Hugging Face's apply_chat_template renders it, and
greedy generation of one reply that stops at the end of the turn.

Rendering follows transformers (utils/chat_template_utils.py, v5): a jinja2
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension and
a `{% generation %}` block that renders its body; `tojson` as json.dumps (ensure_ascii=False, keys
in insertion order, optional indent / separators / sort_keys) instead of jinja2's HTML-escaping
one; globals raise_exception, strftime_now, namespace (no underscore names) and dict. The template
sees messages, tools, documents, add_generation_prompt, the special tokens (bos_token, eos_token,
pad_token, unk_token, from the GGUF's ids) and the caller's keyword arguments. Messages are
copied to plain JSON data first, keys whose value is None are dropped, and a message's reasoning
under `reasoning_content`, `thinking` or `reasoning` is given under the first two names, as
transformers v5 does.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import time
from datetime import datetime
from typing import Any, Callable

import numpy as np

from ._checks import int_arg, token_ids
from .errors import GGUFError, InvalidArgumentError, UnsupportedError

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _import_jinja2():
    try:
        import jinja2
        import jinja2.sandbox  # noqa: F401  (the sandbox module is what renders)
    except ImportError as exc:
        raise UnsupportedError("chat templates need the `jinja2` package "
                               "(pip install 'pyprefill[tokenizer]')") from exc
    return jinja2


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' override: jinja2's own tojson escapes <, >, &, ' for HTML and sorts keys
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _TemplateError(Exception):
    """raise_exception() in a template (becomes InvalidArgumentError for the caller)."""


@functools.lru_cache(maxsize=16)
def _compile(source: str):
    jinja2 = _import_jinja2()
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        # `{% generation %}...{% endgeneration %}` marks assistant text for transformers'
        # assistant-token masks; rendering only needs its body
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            node = jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body)
            return node.set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        # transformers' TemplateNamespace: no underscore-prefixed attributes
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
                raise jinja2.exceptions.SecurityError(
                    f"a chat template cannot store the underscore-prefixed attribute {name!r}")

    class TemplateDict:
        # transformers' TemplateDict: dict(...) and dict.fromkeys(...) without the type itself
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise _TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = Namespace
    env.globals["dict"] = TemplateDict()
    return env.from_string(source)


def _plain(value: Any) -> Any:
    """Value as plain JSON data (str, int, float, bool, None, dict, list, tuple); anything else
    becomes "<TypeName>", so the sandbox never sees an object's methods (transformers'
    _plain_template_data)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def _normalize_messages(messages) -> list[dict]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, (list, tuple)):
        raise InvalidArgumentError("messages: expected a list of {'role': ..., 'content': ...} "
                                   f"dicts, got {type(messages).__name__}")
    if not messages:
        raise InvalidArgumentError("messages: the conversation is empty (give at least one "
                                   "message)")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidArgumentError(f"messages[{i}]: expected a dict, got {type(m).__name__}")
        m = {k: v for k, v in _plain(m).items() if v is not None}
        reasoning = next((m[k] for k in _REASONING_FIELDS if k in m), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def render_chat_template(source: str, messages, *, add_generation_prompt: bool = True,
                         tools=None, documents=None, origin: str = "chat_template",
                         **kwargs) -> str:
    """The text of `messages` through the jinja2 chat template `source` (see the module
    docstring). `origin` names the template in errors: a template that does not parse is a
    GGUFError when it came from the GGUF, an InvalidArgumentError otherwise; raise_exception()
    and other failures while rendering are InvalidArgumentError."""
    jinja2 = _import_jinja2()
    try:
        template = _compile(source)
    except jinja2.TemplateSyntaxError as e:
        cls = GGUFError if "tokenizer.chat_template" in origin else InvalidArgumentError
        raise cls(f"{origin}: does not parse as jinja2 (line {e.lineno}: {e.message})") from None
    chat = _normalize_messages(messages)
    if tools is not None and (not isinstance(tools, (list, tuple))
                              or not all(isinstance(t, dict) for t in tools)):
        raise InvalidArgumentError("tools: expected a list of JSON schemas (dicts)")
    try:
        return template.render(messages=chat, tools=_plain(tools), documents=_plain(documents),
                               add_generation_prompt=bool(add_generation_prompt),
                               **_plain(kwargs))
    except _TemplateError as e:
        raise InvalidArgumentError(f"{origin}: raise_exception: {e}") from None
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise InvalidArgumentError(f"{origin}: rendering failed ({type(e).__name__}: {e})"
                                   ) from None


def chat_messages(messages, system: str | None = None) -> list[dict]:
    """A conversation from a user's text or a list of messages, with `system` as the first
    message when given."""
    if isinstance(messages, str):
        out = [{"role": "user", "content": messages}]
    elif isinstance(messages, (list, tuple)):
        out = list(messages)
    else:
        raise InvalidArgumentError("messages: expected the user's text or a list of {'role': "
                                   f"..., 'content': ...}} dicts, got {type(messages).__name__}")
    if system is not None:
        if out and isinstance(out[0], dict) and out[0].get("role") == "system":
            raise InvalidArgumentError("system: the messages already begin with a system message")
        out.insert(0, {"role": "system", "content": system})
    return out


@dataclasses.dataclass
class Reply:
    """One generated turn."""
    text: str                 # the reply's text (the end-of-turn token not included)
    ids: list[int]            # its token ids (idem)
    stop_id: int | None       # the end-of-turn id that ended it; None when max_new_tokens did
    prompt_tokens: int
    prefill_s: float          # the prompt's prefill, wall seconds
    generate_s: float         # the reply's tokens after the first, wall seconds


def generate_reply(session, prompt_ids, tokenizer, max_new_tokens: int,
                   on_text: Callable[[str], None] | None = None) -> Reply:
    """Prefill `prompt_ids` on `session` (a Session from its position), then greedy tokens until
    one of tokenizer.end_of_turn_ids or max_new_tokens. on_text receives the reply's text as it
    grows (whole characters only: a character cut across tokens comes with the token ending it)."""
    max_new_tokens = int_arg(max_new_tokens, "max_new_tokens", 1)
    ids = token_ids(prompt_ids, "prompt_ids")     # the vocabulary: session.prefill's check
    stop = tokenizer.end_of_turn_ids
    stream = tokenizer.stream()
    pieces: list[str] = []

    def emit(text: str) -> None:
        if text:
            pieces.append(text)
            if on_text is not None:
                on_text(text)

    t0 = time.perf_counter()
    _, tok = session.prefill(ids, "none", return_token=True)
    t1 = time.perf_counter()
    out: list[int] = []
    stop_id = None
    while True:
        tok = int(tok)
        if tok in stop:
            stop_id = tok
            break
        out.append(tok)
        emit(stream.push(tok))
        if len(out) >= max_new_tokens:
            break
        tok = session.generate(1)[0]      # feeds the last token, returns the next
    emit(stream.finish())
    return Reply("".join(pieces), out, stop_id, int(ids.size), t1 - t0, time.perf_counter() - t1)


__all__ = ["render_chat_template", "chat_messages", "generate_reply", "Reply"]
