"""interlock inside SGLang: the policy as the source of SGLang's CUDA-graph, torch.compile
and attention-backend defaults, with interlock's ``file:line`` in SGLang's own provenance.

Installed into an SGLang environment, interlock registers ``interlock`` in the entry-point
group ``sglang.srt.plugins``; SGLang calls :func:`register` in every process it starts
(``load_plugins``), before any ``ServerArgs`` is resolved. :func:`register` refuses an
SGLang release interlock has not read (:data:`interlock.sglang.READ`) and a policy written
for another release or engine; then it registers two resolution hooks
(``register_resolution_hook``):

- after ``handle_cuda_graph_config`` (SGLang has parsed the user's CUDA-graph flags and
  locked the keys they set, and decided nothing else the policy decides), it resolves the
  policy for the model on this platform and declares each decided field the user left
  unset with ``declare_resolution``, its source string naming the rule and ``file:line``
  (``resolution_result`` and ``_resolved_overrides`` show it); it logs one line per field
  and checks what it declared with SGLang's own checks (a declaration skips them);
- the attention backend waits for ``handle_attention_backend_compatibility``: SGLang
  treats a backend it is given otherwise than one it picks (a given ``torch_native``
  turns CUDA graphs off; the one it falls back to on CPU does not), so the backend is
  declared after SGLang picked its own, and where the policy's differs, that step runs
  again on it, as on a backend the user gave;
- after the pipeline's last step, it reads the final resolution back and stops on any
  field a later step changed, naming that step; then it appends a decision record when a
  decision log is configured (``$INTERLOCK_DECISION_LOG``).

SGLang logs and ignores an exception raised by a plugin at import or in ``register``, and
would then run on its own defaults: every failure here writes one line to stderr and exits
(``SystemExit``, which SGLang does not catch) with interlock's documented code: 5 for a
refusal (the policy's, or a release not read), 1 for a policy error, 3 for anything else.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from interlock.app.engine_stop import stop_engine
from interlock.core.env import Settings
from interlock.core.errors import LocatedError
from interlock.policy.model import Policy
from interlock.policy.resolution import Resolution
from interlock.sglang import READ

#: What the plugin logs through: SGLang's logger tree, so the lines carry its format.
LOGGER = "sglang.interlock"
PREFIX = "interlock: "
#: The step the decision is declared after, and the pipeline's last step, after which it is
#: read back (both in 0.5.23's ``_OVERRIDABLE_HOOKS``).
DECLARE_AFTER = "handle_cuda_graph_config"
BACKEND_AFTER = "handle_attention_backend_compatibility"
READ_BACK_AFTER = "validate_deepep_v2_dispatch_token_budget"
#: Who a decision record names as the resolver.
RECORD_COMMAND = "sglang plugin"
#: Each decision field: the ``ServerArgs`` field it lives in, and its phase and key there
#: for the CUDA-graph fields (``cuda_graph_config.decode.backend``).
WHERE: dict[str, tuple[str, str | None, str | None]] = {
    "decode_cuda_graph": ("cuda_graph_config", "decode", "backend"),
    "prefill_cuda_graph": ("cuda_graph_config", "prefill", "backend"),
    "torch_compile": ("enable_torch_compile", None, None),
    "attention_backend": ("attention_backend", None, None),
    "decode_cuda_graph_max_bs": ("cuda_graph_config", "decode", "max_bs"),
    "prefill_cuda_graph_max_bs": ("cuda_graph_config", "prefill", "max_bs"),
}
#: Where the plugin keeps what it declared, on the ``ServerArgs`` being resolved.
STATE = "_interlock_decision"
_logger = logging.getLogger(LOGGER)


class PluginRefusal(LocatedError):
    """What the plugin will not do: govern a release it has not read, a policy for another
    engine, a decision SGLang rejects or a later step changed. The engine stops (exit 5)."""

    kind = "refused"


@dataclass(frozen=True)
class Declared:
    """What the plugin declared for a ``ServerArgs``: the resolution, and each declared
    field's value and source string."""

    resolution: Resolution
    fields: dict[str, tuple[Any, str]]
    version: str
    #: The ``INTERLOCK_*`` settings read once, where the plugin installed its hooks.
    settings: Settings


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: check the release and the policy, register
    the hooks. Any failure stops the process."""
    try:
        _install()
    except BaseException as exc:  # noqa: BLE001 - every failure must stop the engine
        _stop(exc)


def _stop(exc: BaseException) -> NoReturn:
    stop_engine(exc, "SGLang", _logger)


def _guarded(hook: Callable[[Any, Callable[[Any], None]], None]) -> Callable[..., None]:
    """``hook`` as a resolution hook whose failure stops the process (an exception would
    reach the caller of ``resolve_once``, which may go on without the policy)."""

    def run(server_args: Any, previous: Callable[[Any], None]) -> None:
        try:
            hook(server_args, previous)
        except BaseException as exc:  # noqa: BLE001 - as register()
            _stop(exc)

    run.__name__ = hook.__name__
    return run


def _install() -> None:
    import sglang
    from packaging.version import Version

    version = Version(sglang.__version__).public
    if version not in READ:
        raise PluginRefusal(
            f"SGLang {version} was not read by interlock (the plugin governs SGLang "
            f"{', '.join(READ)}): its resolution steps may treat the decision otherwise"
        )
    settings = Settings.read()
    policy = governing_policy(version, settings)
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    register_resolution_hook(DECLARE_AFTER)(_guarded(_declaring(policy, version, settings)))
    register_resolution_hook(BACKEND_AFTER)(_guarded(declare_backend))
    register_resolution_hook(READ_BACK_AFTER)(_guarded(read_back))


def governing_policy(version: str, settings: Settings) -> Policy:
    """The policy the plugin decides with: ``$INTERLOCK_POLICY`` (in ``settings``), else the
    shipped SGLang policy; it must be written for SGLang ``version``."""
    from interlock.core.env import POLICY
    from interlock.policy.loader import SGLANG_ALIAS, load_policy
    from interlock.policy.release import mismatch

    given = settings.environ.get(POLICY.name)
    policy = load_policy([given] if given else [SGLANG_ALIAS])
    files = ", ".join(f.path for f in policy.files)
    if policy.engine != "sglang":
        raise PluginRefusal(
            f"the policy ({files}) decides for {policy.vocabulary.title}, not SGLang: set "
            f"{POLICY.name} to an SGLang policy ({SGLANG_ALIAS} is the shipped one)"
        )
    problem = mismatch(policy, version, "sglang.__version__", engine="sglang")
    if problem is not None:
        raise PluginRefusal(problem)
    return policy


def _declaring(
    policy: Policy, version: str, settings: Settings,
) -> Callable[[Any, Callable[[Any], None]], None]:
    def declare(server_args: Any, previous: Callable[[Any], None]) -> None:
        previous(server_args)
        declare_decision(server_args, policy, version, settings)

    return declare


def declare_decision(
    server_args: Any, policy: Policy, version: str, settings: Settings,
) -> Declared:
    """Resolve the policy for ``server_args``'s model and declare each decided field the
    user left unset; log one line per field; check the declarations with SGLang's own
    checks."""
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.arg_groups.overrides import declare_resolution
    from sglang.srt.model_executor.cuda_graph_config import with_phase

    from interlock.app.query import decide_context

    # The one decision every reader makes; a refusal stops (exit 5).
    resolution = decide_context(policy, _context(server_args, version))
    locked: set[tuple[str, str]] = getattr(server_args, "_cuda_graph_config_locked", set())
    raw = getattr(server_args, "_raw_input", {})
    fields: dict[str, tuple[Any, str]] = {}
    _logger.info("%sgoverning %s with policy %s", PREFIX, resolution.context.architecture,
                 policy.version)
    for name, value in resolution.decision.to_dict().items():
        target, phase, key = WHERE[name]
        if value is None or name == "attention_backend":
            continue  # left to SGLang; the backend is declared by declare_backend
        if (phase, key) in locked if phase else raw.get(target) not in (None, False):
            _line(f"left {name} to the user ({target} given)")
            continue
        prov = resolution.provenance[name]
        source = f"interlock: {prov.source} ({prov.stage}) {prov.location}"
        if phase is not None:
            graphs = resolving_view(server_args).cuda_graph_config
            declare_resolution(server_args, source,
                               cuda_graph_config=with_phase(graphs, phase, **{str(key): value}))
        else:
            declare_resolution(server_args, source, **{target: value})
        fields[name] = (value, source)
        _line(f"decided {name}={_shown(value)} by {prov.source} ({prov.stage}) {prov.location}")
    _validate(server_args, fields)
    declared = Declared(resolution, fields, version, settings)
    setattr(server_args, STATE, declared)
    return declared


def declare_backend(server_args: Any, previous: Callable[[Any], None]) -> None:
    """After SGLang's attention-backend step: declare the policy's backend where the user
    gave none; where it is not SGLang's own pick, run the step again on it."""
    from sglang.srt.arg_groups.overrides import declare_resolution

    previous(server_args)
    declared: Declared | None = getattr(server_args, STATE, None)
    if declared is None:
        raise PluginRefusal(f"SGLang ran {BACKEND_AFTER} before {DECLARE_AFTER}, the step "
                            "interlock decides after: this is not the release interlock read")
    name, resolution = "attention_backend", declared.resolution
    value = resolution.decision.to_dict()[name]
    if getattr(server_args, "_raw_input", {}).get(name) is not None:
        _line(f"left {name} to the user ({name} given)")
        return
    prov = resolution.provenance[name]
    source = f"interlock: {prov.source} ({prov.stage}) {prov.location}"
    own = _final(server_args, name)
    declare_resolution(server_args, source, **{name: value})
    declared.fields[name] = (value, source)
    _line(f"decided {name}={_shown(value)} by {prov.source} ({prov.stage}) {prov.location}")
    _validate(server_args, {name: (value, source)})
    if value != own:
        previous(server_args)


def _context(server_args: Any, version: str) -> Any:
    """The policy's context: the model's config.json, this process's platform (SGLang's
    CPU engine where it runs on the CPU) and the SGLang release."""
    from sglang.srt.arg_groups.model_override_base import resolving_view

    from interlock.core.platform import detect_platform
    from interlock.policy.context import make_context

    cfg = resolving_view(server_args)
    platform, device_arch, how = ("cpu", "", "SGLang's device cpu") if cfg.device == "cpu" \
        else detect_platform()
    return make_context(
        model=cfg.model_path, platform=platform, device_arch=device_arch or None,
        engine={"sglang": version},
        sources={"platform": how, "engine.sglang": "sglang.__version__"},
    )


def _validate(server_args: Any, fields: dict[str, tuple[Any, str]]) -> None:
    """SGLang's own checks of what was declared (``declare_resolution`` skips them)."""
    from sglang.srt.arg_groups.cuda_graph_hook import validate_cuda_graph_config
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES

    if "attention_backend" in fields:
        value, source = fields["attention_backend"]
        if value not in ATTENTION_BACKEND_CHOICES:
            raise PluginRefusal(f"attention_backend={value} ({source}) is not one of SGLang's "
                                f"backends: {', '.join(ATTENTION_BACKEND_CHOICES)}")
    try:
        validate_cuda_graph_config(server_args)
    except ValueError as exc:
        sources = "; ".join(s for n, (_, s) in fields.items() if WHERE[n][1] is not None)
        raise PluginRefusal(f"SGLang rejects the declared CUDA-graph config ({sources}): "
                            f"{exc}") from None


def read_back(server_args: Any, previous: Callable[[Any], None]) -> None:
    """After the pipeline's last step: every declared field still has its value (else stop,
    naming the step that changed it); then the decision record."""
    previous(server_args)
    declared: Declared | None = getattr(server_args, STATE, None)
    if declared is None:
        raise PluginRefusal(f"the resolution ran without the step interlock declares after "
                            f"({DECLARE_AFTER}): the decision was never declared")
    stash = list(getattr(server_args, "_resolved_overrides", ()))
    for name, (value, source) in declared.fields.items():
        final = _value(name, _final(server_args, WHERE[name][0]))
        if final != value:
            step = _changed_by(stash, name, source)
            raise PluginRefusal(
                f"{name}: interlock declared {_shown(value)} ({source}), but SGLang's step "
                f"{step} changed it to {_shown(final)}; SGLang does not run the policy's "
                "decision here: change the policy for this context, or set the field yourself"
            )
    _line(f"SGLang's final resolution keeps the {len(declared.fields)} decided field(s)")
    from interlock import decision_log

    decision_log.write(
        decision_log.log_path(None, declared.settings), declared.resolution, RECORD_COMMAND,
        model=str(getattr(server_args, "model_path", "")) or None,
        engine={"sglang_version": declared.version, "verified": True, "problems": []},
    )


def _final(server_args: Any, target: str) -> Any:
    from sglang.srt.arg_groups.overrides import resolution_result

    return resolution_result(server_args, target)


def _value(name: str, found: Any) -> Any:
    """The decision field ``name`` of a ``ServerArgs`` field's value."""
    _, phase, key = WHERE[name]
    if phase is None:
        return bool(found) if name == "torch_compile" else found
    return getattr(getattr(found, phase), str(key))


def _changed_by(stash: list[tuple[str, dict[str, Any]]], name: str, source: str) -> str:
    """The first step after interlock's declaration that declared another value of ``name``."""
    target = WHERE[name][0]
    ours = max(i for i, (s, _) in enumerate(stash) if s == source)
    value = _value(name, stash[ours][1][target])
    for step, fields in stash[ours + 1:]:
        if target in fields and _value(name, fields[target]) != value:
            return step
    return "(a step that declares nothing; the ServerArgs field was set directly)"


def _line(text: str) -> None:
    """One line of the plugin, in SGLang's log and on stderr (SGLang's logging may be off)."""
    _logger.info("%s%s", PREFIX, text)
    print(f"{PREFIX}{text}", file=sys.stderr, flush=True)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
