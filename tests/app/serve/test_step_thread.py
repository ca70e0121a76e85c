"""``StepThread`` on the built-in demo model, without HTTP: requests submitted from other
threads share the step loop's batches and get the tokens ``LLM.generate`` gives them; an
abort frees the request's blocks, and ``abort_all`` ends every one; a failing step fails
its requests, not the loop; past ``capacity`` a submission is refused; ``close`` stops the
thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from interlock.llm import LLM
from interlock.runners.batching.request import Request
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.batching.step_loop import StepLoop
from interlock.serve.step_thread import Closed, Overloaded, StepThread, Update

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]]


class Seen:
    """The observer: what the loop reported, from its thread."""

    def __init__(self) -> None:
        self.running: list[int] = []
        self.free: list[int] = []
        self.generated = 0
        self.done: list[Request] = []

    def tokens(self, request: Request, before: int, now: float) -> None:
        self.generated += len(request.output_token_ids) - before

    def finished(self, request: Request) -> None:
        self.done.append(request)

    def stepped(self, step_loop: StepLoop) -> None:
        self.running.append(len(step_loop.scheduler.running))
        self.free.append(step_loop.scheduler.allocator.num_free)


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    with LLM("demo", max_num_seqs=4, seed=0) as model:
        yield model


@pytest.fixture
def loop(llm: LLM) -> Iterator[tuple[StepThread, Seen]]:
    seen = Seen()
    step_thread = StepThread(llm.step_loop, capacity=5, stop_strings=llm.check_stop_strings,
                             observer=seen)
    step_thread.start()
    yield step_thread, seen
    step_thread.close()


class Sink:
    def __init__(self) -> None:
        self.updates: list[Update] = []
        self.done = threading.Event()
        self.expected = 0

    def __call__(self, update: Update) -> None:
        self.updates.append(update)
        if sum(u.finished for u in self.updates) == self.expected:
            self.done.set()


def submit(step_thread: StepThread, requests: list[Request]) -> Sink:
    sink = Sink()
    sink.expected = len(requests)
    step_thread.submit(requests, sink)
    return sink


def test_requests_from_threads_share_batches_and_match_generate(
    llm: LLM, loop: tuple[StepThread, Seen]
) -> None:
    step_thread, seen = loop
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 6, 9)]
    sinks: list[Sink] = []
    requests = [llm.step_loop.make_request(p, s) for p, s in zip(PROMPTS, params, strict=True)]
    threads = [threading.Thread(target=lambda r=r: sinks.append(submit(step_thread, [r])))
               for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(sink.done.wait(60) for sink in sinks)
    offline = llm.generate(PROMPTS, params)
    assert [r.output_token_ids for r in requests] == [list(o.token_ids) for o in offline]
    assert max(seen.running) > 1  # they ran together
    assert seen.generated == 12 + 6 + 9 and len(seen.done) == 3
    assert seen.free[-1] == llm.step_loop.kv_cache.num_blocks
    # Every update but the last of a request is unfinished, and counts grow.
    for sink in sinks:
        counts = [u.num_tokens for u in sink.updates]
        assert counts == sorted(counts) and sink.updates[-1].finished


def test_abort_frees_the_blocks(llm: LLM, loop: tuple[StepThread, Seen]) -> None:
    step_thread, seen = loop
    request = llm.step_loop.make_request([1, 2, 3], SamplingParams(max_tokens=1000,
                                                                ignore_eos=True))
    sink = submit(step_thread, [request])
    assert _wait(lambda: len(sink.updates) >= 2)
    step_thread.abort([request])
    assert sink.done.wait(30)
    assert sink.updates[-1].finished and request.finish_reason.value == "aborted"
    assert _wait(lambda: seen.free[-1] == llm.step_loop.kv_cache.num_blocks)
    assert step_thread.in_flight() == 0


def test_abort_all_ends_every_request_and_the_loop_serves_on(
    llm: LLM, loop: tuple[StepThread, Seen]
) -> None:
    """What a drain that runs out of time does: every admitted request ends ``aborted``,
    its caller told; the loop still takes requests (uvicorn stops it afterwards)."""
    step_thread, _ = loop
    requests = [llm.step_loop.make_request(p, SamplingParams(max_tokens=1000, ignore_eos=True))
                for p in PROMPTS]
    sink = submit(step_thread, requests)
    assert _wait(lambda: len(sink.updates) >= 3)
    step_thread.abort_all()
    assert sink.done.wait(30)
    assert {r.finish_reason.value for r in requests} == {"aborted"}
    assert step_thread.in_flight() == 0
    after = llm.step_loop.make_request([1, 2, 3], SamplingParams(max_tokens=4))
    assert submit(step_thread, [after]).done.wait(30)
    assert len(after.output_token_ids) == 4


def test_a_failing_step_fails_its_requests_not_the_loop(
    llm: LLM, loop: tuple[StepThread, Seen], monkeypatch: pytest.MonkeyPatch
) -> None:
    step_thread, _ = loop
    real = llm.step_loop.step
    calls = []

    def failing() -> list[Request]:
        if not calls:
            calls.append(1)
            raise RuntimeError("out of memory (a test's)")
        return real()

    monkeypatch.setattr(llm.step_loop, "step", failing)
    request = llm.step_loop.make_request([1, 2, 3], SamplingParams(max_tokens=4))
    sink = submit(step_thread, [request])
    assert sink.done.wait(30)
    assert "out of memory (a test's)" in (sink.updates[-1].error or "")
    after = llm.step_loop.make_request([1, 2, 3], SamplingParams(max_tokens=4))
    assert submit(step_thread, [after]).done.wait(30)
    assert len(after.output_token_ids) == 4 and step_thread.alive()


def test_past_capacity_and_after_close_submissions_are_refused(
    llm: LLM, loop: tuple[StepThread, Seen]
) -> None:
    step_thread, _ = loop
    many = [llm.step_loop.make_request([1, 2], SamplingParams(max_tokens=1000, ignore_eos=True))
            for _ in range(6)]
    with pytest.raises(Overloaded, match="admits at most 5"):
        submit(step_thread, many)
    sink = submit(step_thread, many[:5])
    step_thread.close()
    assert sink.done.is_set()  # close aborted them
    assert not step_thread.alive()
    with pytest.raises(Closed):
        submit(step_thread, many[5:])


def _wait(condition, timeout: float = 30.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return False
