"""Chat templates are code from the tokenizer or ``--chat_template``: they are compiled in
transformers' Jinja sandbox and rendered under limits of time, size and arithmetic, so that a
runaway template fails its conversation, not the batch (docs/masking.md, "The template sandbox").
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import functools
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import SandboxedEnvironment
from transformers.utils.chat_template_utils import _compile_jinja_template

if TYPE_CHECKING:
    import jinja2

# Limits of one template render. A normal render takes ~0.1 ms, and one prefix of a 2,000-turn
# conversation a few ms: the limits only stop runaway templates.
RENDER_TIME_LIMIT = 5.0  # seconds of the rendering thread's CPU time
RENDER_MAX_CHARS = 64 << 20  # characters of rendered text
_MAX_INT_BITS = 4096  # widest integer that ``*`` and ``**`` may build in a template
# What ``strftime_now`` gives the templates that print today's date (harmony's system message):
# a fixed day, GPT-OSS's release, so that the same records give the same tokens on any day.
TEMPLATE_DATE = datetime.datetime(2025, 8, 5)


class Sandbox:
    """A tokenizer's chat templates, without and with tools, compiled under the limits
    (``_compile``), and the watchdog that bounds each of their renders."""

    def __init__(self, sources: dict[bool, str]) -> None:
        self.sources = dict(sources)
        compiled = {k: _compile(t) for k, t in sources.items()}
        self.templates = {k: (t, {**t.globals, "strftime_now": _template_date})
                          for k, t in compiled.items()}
        self.watchdog = _Watchdog(RENDER_TIME_LIMIT)

    def render(self, has_tools: bool, variables: dict[str, Any],
               blocks: list[tuple[int, int]] | None = None) -> str:
        """The template's text for ``variables``; ``blocks``, where given, receives the
        character spans of its ``{% generation %}`` blocks (transformers' tracker, as in
        ``apply_chat_template``)."""
        template, template_globals = self.templates[has_tools]
        # What ``template.render`` does, less merging the globals (a ChainMap) on every call.
        context = template.new_context({**template_globals, **variables}, shared=True)
        environment = template.environment
        with self.watchdog:  # may raise RenderTimeout
            try:
                if blocks is None:
                    return environment.concat(template.root_render_func(context))
                pieces: list[str] = []
                with environment.activate_tracker(pieces, blocks):
                    pieces.extend(template.root_render_func(context))
                return environment.concat(pieces)
            except Exception:
                environment.handle_exception()  # re-raises, with the template's lines


def _template_date(format: str) -> str:
    return TEMPLATE_DATE.strftime(format)


class TemplateLimitError(Exception):
    """A template render that would pass ``RENDER_MAX_CHARS`` or ``_MAX_INT_BITS``."""


class RenderTimeout(BaseException):  # not an Exception: no handler may swallow it
    """Raised inside the rendering thread by the watchdog; caught only where a render is asked
    for (``SpanFinder.render``, ``Renderer.default_system``, ``Renderer.foreign_markup``)."""


class _NoFoldingCodeGenerator(CodeGenerator):
    """Jinja's code generator, except that it evaluates nothing while compiling.

    Jinja turns an output expression with constant operands (``{{ 'x'|center(10000000000) }}``)
    into its value at compile time, whatever the ``optimized`` setting; with ``optimized=False``
    this is the only place left where compiling runs template code.
    """

    def _output_child_to_const(self, node: nodes.Expr, frame: Any, finalize: Any) -> str:
        if not isinstance(node, (nodes.TemplateData, nodes.Const)):  # literals only
            raise nodes.Impossible()
        return super()._output_child_to_const(node, frame, finalize)

    def visit_EvalContextModifier(self, node: nodes.EvalContextModifier, frame: Any) -> None:
        # ``{% autoescape EXPR %}`` folds EXPR; only a literal is taken at compile time.
        for keyword in node.options:
            self.writeline(f"context.eval_ctx.{keyword.key} = ")
            self.visit(keyword.value, frame)
            if isinstance(keyword.value, nodes.Const):
                setattr(frame.eval_ctx, keyword.key, keyword.value.value)
            else:
                frame.eval_ctx.volatile = True


_DICT_ATTRIBUTES = frozenset(dir(dict))


class _Limits:
    """Mixed into the class of transformers' sandboxed environment (see ``_compile``)."""

    code_generator_class = _NoFoldingCodeGenerator
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for items, times in ((left, right), (right, left)):
                if (isinstance(items, (str, list, tuple)) and isinstance(times, int)
                        and len(items) * times > RENDER_MAX_CHARS):
                    raise TemplateLimitError(
                        f"'*' would build {len(items) * times:,} items, more than "
                        f"RENDER_MAX_CHARS {RENDER_MAX_CHARS:,}")
            if (isinstance(left, int) and isinstance(right, int)
                    and left.bit_length() + right.bit_length() > _MAX_INT_BITS):
                raise TemplateLimitError(f"'*' would build an integer wider than {_MAX_INT_BITS} "
                                         "bits")
        elif (operator == "**" and isinstance(left, int) and isinstance(right, int)
              and abs(left) > 1 and right * (left.bit_length() - 1) >= _MAX_INT_BITS):
            raise TemplateLimitError(f"'**' would build an integer wider than {_MAX_INT_BITS} bits")
        return super().call_binop(context, operator, left, right)  # type: ignore[misc]

    def getattr(self, obj: Any, attribute: str) -> Any:
        """``message.role`` on a plain dict without the sandbox's failed ``getattr`` first: a
        name that ``dict`` lacks is never an attribute of one, so Jinja would look the key up."""
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)  # type: ignore[attr-defined]
        return super().getattr(obj, attribute)  # type: ignore[misc]

    def concat(self, pieces: Any) -> str:
        """``"".join``, counting characters as the template produces them."""
        kept = []
        size = 0
        for piece in pieces:
            size += len(piece)
            if size > RENDER_MAX_CHARS:
                raise TemplateLimitError(f"the rendered text passes RENDER_MAX_CHARS "
                                         f"{RENDER_MAX_CHARS:,} characters")
            kept.append(piece)
        return "".join(kept)


@functools.cache
def _limited(sandbox: type) -> type:
    return type(f"Limited{sandbox.__name__}", (_Limits, sandbox), {})


@functools.lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    """``source`` compiled in transformers' chat-template environment, with ``_Limits``.

    The environment comes from compiling an empty template: compiling ``source`` itself there
    would fold its constant expressions, outside any limit.
    """
    base = _compile_jinja_template("").environment
    if not isinstance(base, SandboxedEnvironment):  # never render a template unsandboxed
        raise TypeError(f"transformers compiles chat templates in a {type(base).__name__}, "
                        "not in a Jinja sandbox")
    env = base.overlay(optimized=False)  # its globals, filters and extensions; no folding
    env.__class__ = _limited(type(base))  # the same class with _Limits first in its MRO
    return env.from_string(source)


def _async_exc_function(argument: type) -> Any:
    prototype = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, argument)
    return prototype(("PyThreadState_SetAsyncExc", ctypes.pythonapi))


# Private prototypes: ctypes.pythonapi's own function object is shared with other libraries.
_set_async_exc = _async_exc_function(ctypes.py_object)


_clear_async_exc = _async_exc_function(ctypes.c_void_p)  # None is NULL: clears a pending one


class _Watchdog:
    """Interrupts a render of one thread that runs past ``limit`` seconds of that thread's CPU
    time (up to a quarter more: the watchdog looks every ``limit / 8``).

    ``with watchdog.watching():`` runs the watchdog thread for a batch; ``with watchdog:``
    bounds one render, which then may raise ``RenderTimeout``. Per render that costs two
    uncontended lock acquisitions (about 1 us in all); the thread wakes eight times per
    ``limit``, reading the rendering thread's CPU clock.

    The exception is raised at most once per render, under the lock, and only while that render
    is armed. Leaving the block disarms under the same lock and clears the exception if it was
    raised but has not landed yet (an asynchronous exception lands at the thread's next bytecode
    boundary), so it can never surface after the block. If it lands in ``__exit__`` itself, it
    surfaces from the block, which is where it belongs.
    """

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._armed = False
        self._render = self._interrupted = 0  # the current render's number, the last stopped
        self._thread_id = 0
        self._cpu_time = time.monotonic

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        self._thread_id = threading.get_ident()
        clock_id = getattr(time, "pthread_getcpuclockid", None)
        if clock_id is not None:  # CPU time: threads queuing for the GIL do not age a render
            self._cpu_time = functools.partial(time.clock_gettime, clock_id(self._thread_id))
        self._stopped.clear()
        watcher = threading.Thread(target=self._watch, name="chat-template-watchdog", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            with self._lock:
                self._armed = False
            self._stopped.set()

    def __enter__(self) -> None:
        with self._lock:
            self._render += 1
            self._armed = True

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self._armed = False
            if self._interrupted == self._render:
                _clear_async_exc(self._thread_id, None)

    def _watch(self) -> None:
        seen, since = 0, 0.0  # the render last seen running, and the CPU time when first seen
        while not self._stopped.wait(self.limit / 8):
            with self._lock:
                if not self._armed or self._interrupted == self._render:
                    continue
                now = self._cpu_time()
                if self._render != seen:
                    seen, since = self._render, now
                elif now - since >= self.limit:
                    self._interrupted = self._render
                    if _set_async_exc(self._thread_id, RenderTimeout) > 1:  # cannot happen
                        _clear_async_exc(self._thread_id, None)

