"""The sandbox a model's chat template renders in, bounded in time and size.

jinja2's sandbox stops a template from reaching Python objects; it does not stop one from
running for hours or building gigabytes (nested loops, ``'a'.center(2e9)``, ``'%0*d'``,
repeated ``replace`` or ``~``), which once aborted the process through the Rust
tokenizer's allocator. Here every loop iteration, call, filter, concatenation and
arithmetic operator passes a checkpoint that enforces a deadline
(:data:`RENDER_SECONDS`) and refuses a result, or an argument that promises one, past
:data:`MAX_CHARS` characters. A prompt is bounded by the model length anyway, so these
bounds never refuse a real conversation. Includes, imports and extends have no loader
to read from; ``lipsum`` is not offered.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

#: The longest text a template may build (a prompt of 256 k tokens is ~1 M characters).
MAX_CHARS = 4 << 20
#: How long one render may run.
RENDER_SECONDS = 5.0


_DROPPED_FILTERS = ("wordwrap", "urlize")
# A width or precision in a format string ('{:>2000000000}', '%0*d' takes its from args).
_FORMAT_NUMBER = re.compile(r"\d{8,}")


class TemplateBoundError(TemplateError):
    """A template ran past the time or size bound."""


def _size(value: object) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else 0


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """An immutable jinja2 sandbox whose renders stop at :data:`RENDER_SECONDS` and
    :data:`MAX_CHARS` (call :meth:`start` before each render)."""

    intercepted_binops = frozenset(["*", "**", "+", "%", "//", "/", "-"])

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.deadline = float("inf")
        self.globals.pop("lipsum", None)
        self.globals["range"] = self._range
        # Slow on a long text in one call (textwrap, regexes): no chat template needs them.
        for name in _DROPPED_FILTERS:
            self.filters.pop(name, None)
        self.filters = {name: self._bounded(f) for name, f in self.filters.items()}

    def start(self) -> None:
        self.deadline = time.monotonic() + RENDER_SECONDS

    # -- the checkpoint -----------------------------------------------------------------

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateBoundError(f"rendering took longer than {RENDER_SECONDS:g} s")

    def check(self, value: Any) -> Any:
        self.tick()
        if _size(value) > MAX_CHARS:
            raise TemplateBoundError(f"the template built a value of {_size(value)} items, "
                                     f"more than {MAX_CHARS}")
        return value

    def _promises(self, args: Iterable[Any], kwargs: dict[str, Any]) -> None:
        """Refuse arguments that ask for a result past the bound (a width, a count)."""
        for arg in (*args, *kwargs.values()):
            if isinstance(arg, (int, float)) and not isinstance(arg, bool) and abs(arg) > MAX_CHARS:
                raise TemplateBoundError(f"an argument of {arg:g} is past the bound of "
                                         f"{MAX_CHARS}")

    def _format(self, text: object) -> None:
        """Refuse a format string whose width or precision is past the bound."""
        if isinstance(text, str):
            for number in _FORMAT_NUMBER.findall(text):
                self._promises((int(number),), {})

    def _bounded(self, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def bounded(*args: Any, **kwargs: Any) -> Any:
            if function.__name__ == "do_format" and args:
                self._format(args[-1] if not isinstance(args[0], str) else args[0])
            self._promises(args[1:], kwargs)
            return self.check(function(*args, **kwargs))

        return bounded

    def _range(self, *args: int) -> Iterator[int]:
        self._promises(args, {})
        for value in range(*args):
            self.tick()
            yield value

    def iterate(self, iterable: Any) -> Iterator[Any]:
        for item in iterable:
            self.tick()
            yield item

    def concat(self, parts: Iterable[Any]) -> str:
        text = "".join(str(part) for part in parts)
        return self.check(text)

    # -- jinja2's hooks -----------------------------------------------------------------

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        __self._promises(args, kwargs)
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(owner, str) and name == "replace" and len(args) >= 2:
            old, new = str(args[0]), str(args[1])
            count = owner.count(old) if old else len(owner) + 1
            __self._expect(len(owner) + count * max(0, len(new) - len(old)))
        elif isinstance(owner, str) and name == "join" and args and isinstance(args[0], list):
            __self._expect(sum(_size(a) for a in args[0]) + len(owner) * len(args[0]))
        elif isinstance(owner, str) and name == "expandtabs":
            __self._expect(len(owner) * (int(args[0]) if args else 8))
        return __self.check(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        if operator_ == "*":
            count = right if isinstance(right, int) else left if isinstance(left, int) else 1
            sized = left if _size(left) else right
            self._expect(_size(sized) * abs(count))
        elif operator_ == "**" and isinstance(left, int) and isinstance(right, int):
            if right > 0 and abs(left) > 1 and right * abs(left).bit_length() > 1 << 16:
                raise TemplateBoundError(f"{left} ** {right} is past the bound")
        elif operator_ == "+":
            self._expect(_size(left) + _size(right))
        elif operator_ == "%" and isinstance(left, str):
            self._format(left)
            self._promises(right if isinstance(right, tuple) else (right,), {})
        return self.check(super().call_binop(context, operator_, left, right))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # jinja2 hands out its own wrapper of str.format at attribute access.
        owner = getattr(value, "__self__", None)
        if isinstance(owner, str) and getattr(value, "__name__", "") in ("format", "format_map"):
            self._format(owner)
        return super().wrap_str_format(value)

    def _expect(self, size: int) -> None:
        if size > MAX_CHARS:
            raise TemplateBoundError(f"the template would build a value of {size} items, "
                                     f"more than {MAX_CHARS}")

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        # Every loop iterates through the checkpoint and every `~` joins through it; as
        # environment attributes, a template cannot shadow them.
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("iterate"), [loop.iter], [],
                                   None, None, lineno=loop.lineno)
        for concat in list(tree.find_all(nodes.Concat)):
            replacement = nodes.Call(
                nodes.EnvironmentAttribute("concat"), [nodes.List(concat.nodes)], [], None,
                None, lineno=concat.lineno,
            )
            _replace(tree, concat, replacement)
        return tree


def _replace(tree: nodes.Node, old: nodes.Node, new: nodes.Node) -> None:
    for node in tree.find_all(nodes.Node):
        for field, value in node.iter_fields():
            if value is old:
                setattr(node, field, new)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new


def render_bounded(template: Any, environment: BoundedSandbox, **values: Any) -> str:
    """``template`` rendered with ``values``, streamed so the output is bounded too."""
    environment.start()
    out: list[str] = []
    total = 0
    for chunk in template.generate(**values):
        total += len(chunk)
        if total > MAX_CHARS:
            raise TemplateBoundError(f"the rendered prompt is longer than {MAX_CHARS} "
                                     "characters")
        environment.tick()
        out.append(chunk)
    return "".join(out)

