"""One registry of ops; a runner's kernel dispatch is a lookup here.

An op has several implementations, each tagged with a backend (``torch``,
``triton``, ``native``, or any name a plugin brings), the platforms and dtypes it serves,
and an availability check. ``select`` returns the implementation *and* the
reason it was chosen, so a run can show its kernel choices.

An op's signature is stated once, by its torch reference: every other implementation must
take the same parameters (``KernelRegistry.signature``), checked when it is registered, or
when it is loaded if it was registered as a lazy path.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from interlock.core.decision import DTYPES
from interlock.core.env import KERNELS
from interlock.core.errors import InterlockError
from interlock.core.platform import GPU_PLATFORMS, PLATFORM_NAMES

#: The backend of the torch references (``interlock.kernels.reference``): an op exists
#: because its reference does; every other backend implements some of those ops.
REFERENCE_BACKEND = "torch"


#: A kernel implementation: any callable taking its op's parameters.
Kernel = Callable[..., Any]


class KernelError(InterlockError, LookupError):
    """No implementation can serve an op as asked."""

    kind = "runtime"


class KernelSignatureError(KernelError):
    """An implementation that does not take its op's parameters; the message names where it
    is defined."""


@dataclass(frozen=True)
class KernelImpl:
    op: str
    backend: str
    target: Kernel | str  # the function, or a lazy "module:attr" path
    platforms: frozenset[str]
    dtypes: frozenset[str]
    provider: str = "interlock"
    # Returns why the implementation cannot run on a platform now, or None.
    unavailable: Callable[[str], str | None] | None = None
    # Whether torch.compile can trace it (a call through raw addresses cannot).
    traceable: bool = True
    # Whether it wants linear weights packed by ``pack_weight`` (an implementation of
    # ``linear`` or ``embedding`` that sets this takes packed weights, and is faster with
    # them): a runner whose table chose it packs the weights once, after loading.
    packed_weights: bool = False

    def serves(self, platform: str, dtype: str, compiled: bool = False) -> str | None:
        """None when this implementation can serve (platform, dtype), in code that
        torch.compile traces if ``compiled``, else why not."""
        if platform not in self.platforms:
            return f"{self.backend} {self.op} does not run on {platform}"
        if dtype not in self.dtypes:
            return f"{self.backend} {self.op} does not support {dtype}"
        if compiled and not self.traceable:
            return f"{self.backend} {self.op} cannot be traced by torch.compile"
        if self.unavailable is not None:
            why = self.unavailable(platform)
            return None if why is None else f"{self.backend}: {why}"
        return None

    def load(self) -> Kernel:
        if callable(self.target):
            return self.target
        module, _, attr = self.target.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise KernelError(
                f"op {self.op!r}: cannot load {self.backend} implementation {self.target!r} "
                f"from {self.provider}: {exc}"
            ) from exc


@dataclass(frozen=True)
class KernelChoice:
    op: str
    impl: KernelImpl
    fn: Kernel
    reason: str

    @property
    def label(self) -> str:
        return f"{self.impl.backend} ({self.impl.provider})"


@dataclass
class KernelRegistry:
    _impls: dict[str, list[KernelImpl]] = field(default_factory=dict)

    def register(self, impl: KernelImpl) -> KernelImpl:
        """Add an implementation; an op is opened by its reference (backend ``torch``), and
        another backend's implementation of an op without one, or of other parameters than
        the reference's, is refused."""
        if impl.backend != REFERENCE_BACKEND and impl.op not in self._impls:
            raise KernelError(
                f"op {impl.op!r} has no {REFERENCE_BACKEND} reference, so {impl.backend!r} "
                f"(from {impl.provider}) cannot implement it; known ops: {', '.join(self.ops())}"
            )
        for other in self._impls.get(impl.op, []):
            if other.backend == impl.backend:
                raise KernelError(
                    f"op {impl.op!r}: backend {impl.backend!r} registered twice "
                    f"(by {other.provider} and {impl.provider})"
                )
        if impl.backend != REFERENCE_BACKEND and callable(impl.target):
            self._check_signature(impl, impl.target)
        self._impls.setdefault(impl.op, []).append(impl)
        return impl

    def signature(self, op: str) -> inspect.Signature:
        """The parameters every implementation of ``op`` takes: its reference's names, order,
        kinds and defaults (not its annotations, which each backend spells its own way)."""
        reference = next(i for i in self.implementations(op) if i.backend == REFERENCE_BACKEND)
        return _parameters(reference.load())

    def function(self, impl: KernelImpl) -> Kernel:
        """``impl``'s function, loaded if lazy and then checked against its op's signature
        (registering a lazy path imports nothing, so it could not be checked then)."""
        fn = impl.load()
        if impl.backend != REFERENCE_BACKEND and not callable(impl.target):
            self._check_signature(impl, fn)
        return fn

    def _check_signature(self, impl: KernelImpl, fn: Kernel) -> None:
        expected = self.signature(impl.op)
        try:
            got = _parameters(fn)
        except (TypeError, ValueError) as exc:  # a callable inspect cannot read, e.g. in C
            difference = f"its parameters cannot be read ({exc})"
        else:
            if got == expected:
                return
            difference = f"it takes {got}: {_difference(expected, got)}"
        raise KernelSignatureError(
            f"op {impl.op!r}: {impl.backend} implementation {_name(fn)} (from {impl.provider}) "
            f"does not take the op's parameters {expected}: {difference} (at {_source(fn)})"
        )

    def implement(
        self,
        op: str,
        backend: str,
        *,
        platforms: Iterable[str] = PLATFORM_NAMES,
        dtypes: Iterable[str] = DTYPES,
        provider: str = "interlock",
        unavailable: Callable[[str], str | None] | None = None,
    ) -> Callable[[Kernel], Kernel]:
        """Decorator form of ``register``."""

        def wrap(fn: Kernel) -> Kernel:
            self.register(
                KernelImpl(op, backend, fn, frozenset(platforms), frozenset(dtypes), provider,
                           unavailable)
            )
            return fn

        return wrap

    def ops(self) -> list[str]:
        return sorted(self._impls)

    def backends(self) -> list[str]:
        return sorted({i.backend for impls in self._impls.values() for i in impls})

    def implementations(self, op: str) -> list[KernelImpl]:
        if op not in self._impls:
            raise KernelError(f"unknown op {op!r}; known ops: {', '.join(self.ops())}")
        return list(self._impls[op])

    def select(
        self,
        op: str,
        platform: str,
        dtype: str,
        preference: Sequence[str] | None = None,
        force: str | None = None,
        compiled: bool = False,
    ) -> KernelChoice:
        """Pick an implementation of ``op`` (for code torch.compile traces if ``compiled``).

        ``force`` (a run's ``ModelSpec.kernels``: ``$INTERLOCK_KERNELS``, read where the run
        started) names a backend that must serve every op it implements: if it cannot, that
        is an error, never a silent fallback. An op it does not implement (a plugin backend
        usually brings a few) is chosen as usual, and the reason says so.
        """
        impls = self.implementations(op)
        force = force or None
        rejected: list[str] = []
        if force is not None:
            backends = self.backends()
            if force not in backends:
                raise KernelError(
                    f"{KERNELS.name}={force!r} is not a kernel backend; known: "
                    f"{', '.join(backends)}"
                )
            impl = next((i for i in impls if i.backend == force), None)
            if impl is not None:
                why_not = impl.serves(platform, dtype, compiled)
                if why_not is not None:
                    raise KernelError(f"backend {force!r} was forced for op {op!r}: {why_not}")
                return KernelChoice(op, impl, self.function(impl), f"forced {force}")
            rejected.append(f"forced {force} has no {op}")

        order = list(preference) if preference is not None else default_preference(platform)
        for backend in order:
            impl = next((i for i in impls if i.backend == backend), None)
            if impl is None:
                rejected.append(f"no {backend} implementation")
                continue
            why_not = impl.serves(platform, dtype, compiled)
            if why_not is not None:
                rejected.append(why_not)
                continue
            reason = f"preferred {backend} on {platform}"
            if rejected:
                reason += " (" + "; ".join(rejected) + ")"
            return KernelChoice(op, impl, self.function(impl), reason)
        raise KernelError(
            f"no implementation of op {op!r} serves {platform}/{dtype} with preference "
            f"{order}: " + "; ".join(rejected)
        )


def _parameters(fn: Kernel) -> inspect.Signature:
    """``fn``'s parameters, without annotations."""
    signature = inspect.signature(fn)
    return signature.replace(
        parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
        return_annotation=signature.empty,
    )


def _difference(expected: inspect.Signature, got: inspect.Signature) -> str:
    """What ``got`` has other than ``expected``, in words."""
    want, have = list(expected.parameters), list(got.parameters)
    missing = [name for name in want if name not in have]
    extra = [name for name in have if name not in want]
    if missing or extra:
        renamed = {w: h for w, h in zip(want, have, strict=False) if w in missing and h in extra}
        return ", ".join(
            [f"{h!r} in place of {w!r}" for w, h in renamed.items()]
            + [f"no {name!r}" for name in missing if name not in renamed]
            + [f"an extra {name!r}" for name in extra if name not in renamed.values()]
        )
    if want != have:
        return "the same parameters in another order"
    differences = []
    for name in want:
        w, h = expected.parameters[name], got.parameters[name]
        if w.kind != h.kind:
            differences.append(
                f"{name!r} is {h.kind.description} where the reference's is {w.kind.description}"
            )
        elif w.default != h.default:
            differences.append(f"{name!r} {_default(h)} where the reference's {_default(w)}")
    return "; ".join(differences)


def _default(parameter: inspect.Parameter) -> str:
    if parameter.default is parameter.empty:
        return "has no default"
    return f"defaults to {parameter.default!r}"


def _name(fn: Kernel) -> str:
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(fn)


def _source(fn: Kernel) -> str:
    """file:line where ``fn`` (or the class of a callable object) is defined."""
    target = inspect.unwrap(fn)
    for candidate in (target, type(target)):
        try:
            path = inspect.getsourcefile(candidate)
            _, line = inspect.getsourcelines(candidate)
        except (TypeError, OSError):
            continue
        if path is not None:
            return f"{path}:{line}"
    return "an unknown source file"


def default_preference(platform: str) -> list[str]:
    """Triton where it compiles for the device, the native kernels on the CPU; torch
    everywhere."""
    return ["triton", "torch"] if platform in GPU_PLATFORMS else ["native", "torch"]


REGISTRY = KernelRegistry()
