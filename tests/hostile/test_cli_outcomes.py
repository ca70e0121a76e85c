"""Items 4, 12, 13, 25, 30 and 34 of the hostile-inputs issue: what a command shows and
returns, whatever happens."""

from __future__ import annotations

import io
import json

import pytest

from interlock.core import terminal
from interlock.core.errors import EXIT_CODES, InputError

EVIL = "Evil\x1b]0;pwned\x07\x1b[2J\rArch\u202eLM"


def test_04_terminal_escapes_in_untrusted_text_are_shown_not_obeyed(cli, tmp_path) -> None:
    res = cli("explain", EVIL, "--platform", "cuda")
    assert res.code == 0
    for raw in ("\x1b", "\x07", "\r", "\u202e"):
        assert raw not in res.out and raw not in res.err
    assert "Evil\\x1b]0;pwned\\x07\\x1b[2J\\x0dArch\\u202eLM on cuda" in res.out
    # From a config.json and from a policy path, and in error messages too.
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": [EVIL]}))
    res = cli("explain", "--model", model, "--platform", "cuda")
    assert "\x1b" not in res.out and "\\x1b" in res.out
    res = cli("explain", "X", "--platform", "cuda", "--policy", str(tmp_path / "no\x1b[31m.yaml"))
    assert res.code == 1 and "\x1b" not in res.err and "no\\x1b[31m.yaml" in res.err
    # JSON stays exact: the document holds the real string.
    res = cli("explain", EVIL, "--platform", "cuda", "--json")
    assert res.json()["context"]["architecture"] == EVIL


def test_04_interlock_colour_passes_but_planted_colour_does_not() -> None:
    out = io.StringIO()
    terminal.EscapingWriter(out).write(terminal.color("ok", "1") + "\x1b[8mhidden")
    assert out.getvalue() == "\x1b[1mok\x1b[0m\\x1b[8mhidden"


def test_12_ctrl_c_exits_130_with_one_line(cli, monkeypatch) -> None:
    from interlock.commands import explain as common

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "resolve_args", interrupted)
    res = cli("explain", "LlamaForCausalLM", "--platform", "cuda")
    assert (res.code, res.err, res.out) == (130, "policy: interrupted\n", "")
    res = cli("explain", "LlamaForCausalLM", "--platform", "cuda", "--json")
    assert res.code == 130 and res.json()["error"]["kind"] == "interrupted"


@pytest.mark.parametrize("json_mode", [False, True])
def test_12_ctrl_c_during_run_prints_what_was_generated(cli, monkeypatch, json_mode) -> None:
    from interlock.runners.batching.step_loop import StepLoop

    real_step, calls = StepLoop.step, []

    def step(self):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real_step(self)

    monkeypatch.setattr(StepLoop, "step", step)
    argv = [
        "run",
        "--model",
        "demo",
        "--max-tokens",
        "8",
        "--set",
        "cudagraph=none",
        "--prompt-token-ids",
        "1,2,3",
        *(["--json"] if json_mode else []),
    ]
    res = cli(*argv)
    assert res.code == 130 and "Traceback" not in res.err
    if json_mode:
        (output,) = res.json()["error"]["outputs"]
    else:
        assert "-> [" in res.out and "(aborted)" in res.out
        return
    assert output["finish_reason"] == "aborted" and len(output["token_ids"]) == 3


def test_13_seed_out_of_range_is_refused_up_front(cli) -> None:
    res = cli("run", "--model", "demo", "--seed", str(2**63), "--max-tokens", "1")
    assert res.code == 1 and "seed=9223372036854775808 is out of range" in res.err
    assert "policy run:" not in res.err  # refused before the decision is logged


def test_13_a_failing_step_ends_every_request_and_leaves_the_engine_clean(monkeypatch) -> None:
    from interlock.llm import LLM
    from interlock.runners.batching.sampling import SamplingParams
    from interlock.runners.contract import Decision

    llm = LLM("demo", decision=Decision(runner="mrv1", cudagraph="none"), device="cpu")
    runner, calls = llm.step_loop.runner, []
    real = runner.execute

    def failing(batch):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("step failed")
        return real(batch)

    monkeypatch.setattr(runner, "execute", failing)
    with pytest.raises(RuntimeError, match="step failed"):
        llm.generate([[1, 2], [3, 4, 5]], SamplingParams(temperature=0, max_tokens=4))
    assert not llm.step_loop.has_unfinished()
    assert llm.step_loop.scheduler.allocator.num_free == llm.step_loop.kv_cache.num_blocks
    [out] = llm.generate([[1, 2]], SamplingParams(temperature=0,
        max_tokens=2))  # the engine still works
    assert len(out.token_ids) == 2


@pytest.mark.parametrize(
    "prompts, params, message",
    [
        ([[1, 2.5]], {}, "prompts[0]: prompt token ids must be integers; got 2.5"),
        ([[1, 2], [1, True]], {}, "prompts[1]: prompt token ids must be integers; got True"),
        ([[1], None], {}, "prompts[1]: a prompt is text or a list of token ids; got NoneType"),
        ([[1, 99999]], {}, "prompts[0]: prompt token ids [99999] are outside the vocabulary"),
        ([[1]], {"max_tokens": 2.5}, "max_tokens=2.5 is invalid"),
        ([[1]], {"max_tokens": True}, "max_tokens=True is invalid"),
    ],
)
def test_25_python_api_types_are_strict(prompts, params, message) -> None:
    from interlock.llm import LLM
    from interlock.runners.batching.sampling import SamplingParams
    from interlock.runners.contract import Decision

    llm = _demo_llm(LLM, Decision)
    with pytest.raises(InputError) as info:
        llm.generate(prompts, SamplingParams(**params) if params else None)
    assert message in str(info.value)
    assert not llm.step_loop.has_unfinished()


_LLM = []


def _demo_llm(llm_cls, decision_cls):  # type: ignore[no-untyped-def]
    if not _LLM:
        _LLM.append(
            llm_cls("demo", decision=decision_cls(runner="mrv1", cudagraph="none"), device="cpu")
        )
    return _LLM[0]


@pytest.mark.parametrize(
    "argv, kind",
    [
        (["explain", "X", "--platform", "cuda", "--set", "cudagraph=sideways"], "policy"),
        (["explain", "X", "--platform", "cuda", "--policy", "/no/such.yaml"], "policy"),
        (["explain", "--no-such-flag"], "usage"),
        (["run", "--model", "/no/such/model"], "input"),
        (["table", "--format", "json", "--policy", "/no/such.yaml"], "policy"),
        (["plugins", "--json", "--bogus"], "usage"),
    ],
)
def test_30_json_errors_are_one_document_with_a_documented_code(cli, argv, kind) -> None:
    res = cli(*argv, *([] if "--json" in argv or "json" in argv else ["--json"]))
    error = res.json()["error"]
    assert set(error) == {"kind", "message", "location"}
    assert error["kind"] == kind and res.code == EXIT_CODES[kind]
    assert error["message"] and error["message"].splitlines()[0] in res.err


def test_30_a_bug_exits_70_with_a_traceback_and_a_report_line(cli, monkeypatch) -> None:
    from interlock.commands import explain as common

    def bug(*args: object) -> None:
        raise ZeroDivisionError("oops")

    monkeypatch.setattr(common, "resolve_args", bug)
    res = cli("explain", "X", "--platform", "cuda", "--json")
    assert res.code == 70
    assert "Traceback" in res.err and "please report it" in res.err
    assert res.json()["error"]["kind"] == "internal"


def test_34_run_accepts_config_json_and_validates_before_logging(cli, tmp_path) -> None:
    from interlock.runners.model.checkpoint import write_demo_checkpoint

    model = write_demo_checkpoint(tmp_path / "demo")
    res = cli(
        "run",
        "--model",
        model / "config.json",
        "--max-tokens",
        "1",
        "--set",
        "cudagraph=none",
        "--json",
    )
    assert res.code == 0, res.err
    res = cli("run", "--model", tmp_path / "nowhere" / "config.json")
    assert res.code == 1 and "policy run:" not in res.err


def test_34_term_dumb_gets_no_colour(monkeypatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert terminal.use_color(Tty())
    monkeypatch.setenv("TERM", "dumb")
    assert not terminal.use_color(Tty())
