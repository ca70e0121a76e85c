"""The HTTP side of ``policy serve``: a Starlette app on uvicorn over one :class:`StepThread`.

Each request is checked on the event loop against the bounds of ``protocol.Limits`` (a
refusal is an OpenAI-shaped JSON error, 400 for a bad request), tokenized on a worker
thread, submitted to the step thread, and answered from the token updates that thread
sends back: as server-sent events while they arrive (``stream``), or in one JSON document
at the end (built on the worker thread when it carries logprobs). A client that goes away
has its requests aborted, which frees their KV-cache blocks. Connections are bounded in
number and in the time they take to send a request (:class:`_GuardedH11`). SIGTERM (or
Ctrl-C) stops taking connections, lets the requests in flight finish (``drain_timeout``),
then ends those still running with finish reason ``abort`` and stops the step loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from interlock import __version__
from interlock.app.outputs import SentText
from interlock.core.errors import InputError, ModelError
from interlock.llm import LLM, completion_params
from interlock.runners.batching.request import FinishReason, Request
from interlock.serve import MAX_CONNECTIONS, MAX_LOGPROBS
from interlock.serve.metrics import ServerMetrics
from interlock.serve.protocol import (
    Limits,
    Parsed,
    RequestError,
    chat_logprobs,
    completion_logprobs,
    new_id,
    now,
    parse_chat,
    parse_completion,
    parse_detokenize,
    parse_tokenize,
    usage,
)
from interlock.serve.step_thread import Closed, Overloaded, StepThread, Update

LOG = logging.getLogger("interlock.serve")
#: A request body larger than this is refused (413) before it is parsed.
MAX_BODY_BYTES = 16 * 2**20
#: After the drain timeout has aborted what was running, the seconds its answers have to
#: reach their clients (``finish_reason: abort``, ``[DONE]``) before uvicorn cancels them.
DRAIN_GRACE = 5
#: asyncio's context message when accept() fails for want of descriptors or memory.
_ACCEPT_EXHAUSTED = "socket.accept() out of system resource"
T = TypeVar("T")


@dataclass
class ServeOptions:
    served: Sequence[str]  # the names clients give as ``model``
    api_key: str | None
    max_queue: int  # admitted requests beyond the running batch
    drain_timeout: int  # seconds
    decision: dict[str, str]  # the info metric's labels
    announce: Callable[[str], None] = field(default=lambda line: None)
    max_logprobs: int = MAX_LOGPROBS
    max_connections: int = MAX_CONNECTIONS  # open connections at most
    receive_timeout: float = 10.0  # seconds to send a request's headers, then its body
    sampling_defaults: dict[str, Any] = field(default_factory=dict)  # the model's own


class _Choice:
    """One completion as it streams: what of it was sent (``LLM.settled_text`` says what
    can be)."""

    def __init__(self, llm: LLM, request: Request, index: int, completion: int) -> None:
        self.llm, self.request, self.index, self.completion = llm, request, index, completion
        self.sent = SentText()

    def advance(self, update: Update) -> tuple[str, list[int]]:
        """The new text and the new tokens' positions since the last call."""
        # The update's token count, not the request's: the step thread may have stepped on.
        text = self.llm.settled_text(self.request, update.num_tokens)
        delta, positions = self.sent.advance(text, update.num_tokens)
        return delta, list(positions)


class Generation:
    """The step loop's requests of one HTTP request, and their updates as they arrive."""

    def __init__(self, loop: StepThread, groups: list[list[Request]]) -> None:
        self.loop = loop
        self.groups = groups
        self.requests = [r for group in groups for r in group]
        self.pending = set(self.requests)
        self.queue: asyncio.Queue[Update] = asyncio.Queue()
        events = asyncio.get_running_loop()

        def deliver(update: Update) -> None:  # on the step thread
            with contextlib.suppress(RuntimeError):  # the event loop has closed
                events.call_soon_threadsafe(self.queue.put_nowait, update)

        loop.submit(self.requests, deliver)

    async def next(self) -> Update:
        update = await self.queue.get()
        if update.finished:
            self.pending.discard(update.request)
        return update

    def abort(self) -> None:
        if self.pending:
            self.loop.abort(list(self.pending))


class Server:
    """The routes over ``llm``'s step loop."""

    def __init__(self, llm: LLM, options: ServeOptions) -> None:
        if llm.tokenizer is None:
            raise ModelError("policy serve needs the model's tokenizer.json: the OpenAI API "
                             "answers with text")
        self.llm, self.options = llm, options
        self.name = options.served[0]
        step_loop = llm.step_loop
        self.metrics = ServerMetrics(self.name, options.decision, step_loop.kv_cache.num_blocks)
        capacity = step_loop.model.max_num_seqs + options.max_queue
        self.loop = StepThread(step_loop, capacity, llm.check_stop_strings, self.metrics)
        max_model_len = step_loop.model.max_model_len
        self.limits = Limits(
            completions=capacity, prompt_tokens=max_model_len,
            prompt_chars=max_model_len * _longest_token(llm),
            logprobs=options.max_logprobs, defaults=dict(options.sampling_defaults),
        )
        # Tokenizing, rendering chat templates and building large answers: off the event
        # loop, one at a time (a chat template's render bound is per thread).
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="interlock-serve-text")
        # Paths of this machine that a refusal's message may carry (a tokenizer's, a chat
        # template's): a client is told the served name, not where the files are.
        tokenizer = llm.tokenizer
        self._private = [(str(tokenizer.path.parent), self.name)]
        if Path.home().parent != Path.home():  # a home of "/" would be every path
            self._private.append((str(Path.home()), "~"))
        self.created = now()
        self.app = Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/ping", self.health, methods=["GET", "POST"]),
                Route("/version", self.version, methods=["GET"]),
                Route("/metrics", self.metrics_text, methods=["GET"]),
                Route("/tokenize", self._guarded(self.tokenize), methods=["POST"]),
                Route("/detokenize", self._guarded(self.detokenize), methods=["POST"]),
                Route("/v1/models", self._guarded(self.models), methods=["GET"]),
                Route("/v1/completions", self._guarded(self.completions), methods=["POST"]),
                Route("/v1/chat/completions", self._guarded(self.chat), methods=["POST"]),
            ],
            exception_handlers={HTTPException: self._http_error},
        )

    async def off_loop(self, work: Callable[[], T]) -> T:
        """``work()`` on the worker thread, so that the event loop keeps serving."""
        return await asyncio.get_running_loop().run_in_executor(self.worker, work)

    def public(self, message: str) -> str:
        """``message`` without this machine's paths."""
        for private, shown in self._private:
            message = message.replace(private, shown)
        return message

    # -- plain routes

    async def health(self, _: HTTPRequest) -> Response:
        if not self.loop.alive():
            why = self.loop.failure or "shutting down"
            return JSONResponse({"status": "unavailable", "reason": why}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def version(self, _: HTTPRequest) -> Response:
        return JSONResponse({"version": __version__})

    async def metrics_text(self, _: HTTPRequest) -> Response:
        return Response(generate_latest(self.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    async def models(self, _: HTTPRequest) -> Response:
        model = self.llm.step_loop.model
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": self.created, "owned_by": "interlock",
             "root": model.name, "max_model_len": model.max_model_len}
            for name in self.options.served
        ]})

    async def _http_error(self, _: HTTPRequest, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "NotFoundError" if exc.status_code == 404 else "invalid_request_error"
        self.metrics.error(exc.status_code)
        return _error(RequestError(str(exc.detail), status=exc.status_code, type=kind))

    # -- the OpenAI routes

    def _guarded(
        self, handler: Callable[[HTTPRequest], Awaitable[Response]]
    ) -> Callable[[HTTPRequest], Awaitable[Response]]:
        """``handler`` behind the API key, its refusals as OpenAI errors; a failure of the
        server's own is a 500 with its one-line cause (and a traceback in the log), never
        a dead server."""

        async def guarded(http: HTTPRequest) -> Response:
            try:
                self._check_key(http)
                return await handler(http)
            except RequestError as exc:
                failure = exc
            except (Overloaded, Closed) as exc:
                failure = RequestError(str(exc), status=503, type="server_overloaded")
            except (InputError, ModelError) as exc:
                failure = RequestError(self.public(str(exc)))
            except RecursionError:  # a body nested past what the parsers walk: the client's
                failure = RequestError("the request body is nested too deeply", param="body")
            except Exception as exc:
                LOG.exception("policy serve: %s %s failed", http.method, http.url.path)
                failure = RequestError(f"internal error: {type(exc).__name__}: {exc}",
                                       status=500, type="server_error")
            self.metrics.error(failure.status)
            return _error(failure)

        return guarded

    def _check_key(self, http: HTTPRequest) -> None:
        key = self.options.api_key
        if key is None:
            return
        given = http.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                  key.encode()):
            raise RequestError("missing or incorrect API key: send Authorization: Bearer KEY",
                               status=401, type="authentication_error")

    async def body(self, http: HTTPRequest) -> object:
        return await _body(http, self.options.receive_timeout)

    async def tokenize(self, http: HTTPRequest) -> Response:
        """vLLM's ``/tokenize``: a ``prompt`` (special tokens added unless
        ``add_special_tokens`` is false) or ``messages`` (as chat renders them)."""
        request = parse_tokenize(await self.body(http), self.options.served, self.limits)
        if request.messages is not None:
            messages = request.messages
            ids = await self.off_loop(lambda: self.llm.apply_chat_template(messages))
        else:
            prompt, special = request.prompt or "", request.add_special_tokens
            ids = await self.off_loop(lambda: list(
                self.llm.tokenizer.encode(prompt, special).ids))  # type: ignore[union-attr]
        answer: dict[str, Any] = {"count": len(ids),
                                  "max_model_len": self.limits.prompt_tokens, "tokens": ids,
                                  "token_strs": None}
        if request.return_token_strs:
            tokenizer = self.llm.tokenizer
            answer["token_strs"] = [tokenizer.id_to_token(t) for t in ids]  # type: ignore[union-attr]
        return JSONResponse(answer)

    async def detokenize(self, http: HTTPRequest) -> Response:
        """vLLM's ``/detokenize``: the text of ``tokens``."""
        tokens = parse_detokenize(await self.body(http), self.options.served, self.limits)
        text = await self.off_loop(lambda: self.llm.decode(tokens))
        return JSONResponse({"prompt": text})

    async def completions(self, http: HTTPRequest) -> Response:
        parsed = parse_completion(await self.body(http), self.options.served, self.limits)
        prompts = await self.off_loop(lambda: [self.llm.encode(p) for p in parsed.prompts])
        return await self._answer(http, parsed, prompts, chat=False)

    async def chat(self, http: HTTPRequest) -> Response:
        parsed = parse_chat(await self.body(http), self.options.served, self.limits)
        prompts = await self.off_loop(lambda: [self.llm.apply_chat_template(parsed.messages)])
        return await self._answer(http, parsed, prompts, chat=True)

    async def _answer(self, http: HTTPRequest, parsed: Parsed, prompts: list[list[int]],
                      chat: bool) -> Response:
        rid = new_id("chatcmpl" if chat else "cmpl")
        step_loop = self.llm.step_loop
        groups = []
        for i, token_ids in enumerate(prompts):
            params = parsed.params
            left = step_loop.model.max_model_len - len(token_ids)
            if parsed.default_max_tokens and params.max_tokens is not None and left >= 1:
                # A default max_tokens (the model's, or completions' 16) is cut to the
                # context the prompt leaves, as vLLM cuts it; a given one is checked.
                params = replace(params, max_tokens=min(params.max_tokens, left))
            try:
                groups.append([step_loop.make_request(token_ids, p, request_id=f"{rid}-{i}-{j}")
                               for j, p in enumerate(completion_params(params))])
            except InputError as exc:
                param = "max_tokens" if "max_tokens" in str(exc) else "prompt"
                raise RequestError(_plain(str(exc)), param=param) from None
        generation = Generation(self.loop, groups)
        reply = _Reply(self, rid, chat, generation, parsed)
        if parsed.stream:
            return StreamingResponse(reply.events(), media_type="text/event-stream")
        return await reply.document(http)


class _Reply:
    """One HTTP request's answer, from its generation's updates."""

    def __init__(self, server: Server, rid: str, chat: bool, generation: Generation,
                 parsed: Parsed) -> None:
        self.server, self.llm, self.rid, self.chat = server, server.llm, rid, chat
        self.generation, self.parsed = generation, parsed
        self.created = now()
        # Choice i * n + j is completion j of prompt i, as OpenAI numbers them.
        self.choices: dict[Request, _Choice] = {}
        for group in generation.groups:
            for j, request in enumerate(group):
                self.choices[request] = _Choice(self.llm, request, len(self.choices), j)

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.rid, "object": kind, "created": self.created,
                "model": self.server.name}

    def _usage(self) -> dict[str, int]:
        groups = self.generation.groups
        return usage(sum(len(g[0].prompt_token_ids) for g in groups),
                     sum(len(r.output_token_ids) for r in self.generation.requests))

    def _logprobs(self, choice: _Choice, positions: list[int]) -> dict[str, Any] | None:
        request = choice.request
        if request.params.logprobs is None:
            return None
        steps = [request.logprobs[p] for p in positions]
        ids = [request.output_token_ids[p] for p in positions]
        texts = [self.llm.decode([t]) for t in ids]
        if self.chat:
            return chat_logprobs(texts, steps, [
                [(self.llm.decode([t]), lp) for t, lp in step.top] for step in steps])
        offset = len(self.llm.decode(request.output_token_ids[: positions[0]])) \
            if positions else 0
        return completion_logprobs(texts, steps, [
            {self.llm.decode([t]): lp for t, lp in step.top} for step in steps], offset)

    def _finish(self, request: Request) -> str | None:
        reason = request.finish_reason
        if reason is None:
            return None
        return "abort" if reason is FinishReason.ABORTED else reason.value

    async def document(self, http: HTTPRequest) -> Response:
        """Wait for every completion (aborting them if the client goes away); one JSON."""
        gone = asyncio.ensure_future(_disconnected(http))
        try:
            while self.generation.pending:
                update = asyncio.ensure_future(self.generation.next())
                done, _ = await asyncio.wait({update, gone},
                                             return_when=asyncio.FIRST_COMPLETED)
                if update not in done:
                    update.cancel()
                    return Response(status_code=499)  # nobody reads it
                error = update.result().error
                if error is not None:  # the step thread has logged it
                    raise RequestError(error, status=500, type="server_error")
        finally:
            gone.cancel()
            self.generation.abort()
        if self.parsed.params.logprobs is not None:  # up to max_logprobs decodes a token
            return await self.server.off_loop(self._document)
        return self._document()

    def _document(self) -> Response:
        choices = []
        for choice in self.choices.values():
            out = self.llm.completion_output(choice.completion, choice.request)
            entry: dict[str, Any] = {"index": choice.index,
                                     "logprobs": self._logprobs(choice, list(
                                         range(len(out.token_ids)))),
                                     "finish_reason": self._finish(choice.request),
                                     "stop_reason": out.stop_reason}
            if self.chat:
                entry["message"] = {"role": "assistant", "content": out.text}
            else:
                entry["text"] = out.text
            choices.append(entry)
        kind = "chat.completion" if self.chat else "text_completion"
        return JSONResponse({**self._head(kind), "choices": choices, "usage": self._usage()})

    async def events(self) -> AsyncIterator[str]:
        """Server-sent events, one chunk per step per completion, then ``[DONE]``; when the
        client disconnects, the stream is cancelled here and its requests aborted."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        include_usage = self.parsed.include_usage
        try:
            if self.chat:
                for choice in self.choices.values():
                    yield _event(self._chunk(kind, choice.index,
                                             {"role": "assistant", "content": ""}, None, None))
            while self.generation.pending:
                update = await self.generation.next()
                if update.error is not None:
                    error = RequestError(update.error, status=500, type="server_error")
                    yield _event(error.body())
                    break
                choice = self.choices[update.request]
                delta, positions = choice.advance(update)
                if not delta and not update.finished:
                    continue
                finish = self._finish(update.request) if update.finished else None
                body = ({"content": delta} if delta else {}) if self.chat else delta
                chunk = self._chunk(kind, choice.index, body, finish,
                                    self._logprobs(choice, positions))
                if include_usage:
                    chunk["usage"] = None
                yield _event(chunk)
            else:
                if include_usage:
                    yield _event({**self._head(kind), "choices": [], "usage": self._usage()})
            yield "data: [DONE]\n\n"
        finally:
            self.generation.abort()

    def _chunk(self, kind: str, index: int, body: Any, finish: str | None,
               logprobs: dict[str, Any] | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": finish}
        choice["delta" if self.chat else "text"] = body
        return {**self._head(kind), "choices": [choice]}


def _event(document: dict[str, Any]) -> str:
    return f"data: {json.dumps(document, ensure_ascii=False)}\n\n"


def _error(exc: RequestError) -> Response:
    headers = {"Retry-After": "1"} if exc.status == 503 else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def _plain(message: str) -> str:
    """A step loop's refusal without its internal request id (``request cmpl-...-0-0: ``)."""
    return message.split(": ", 1)[1] if message.startswith("request ") else message


async def _body(http: HTTPRequest, timeout: float) -> object:
    """The JSON body, read within ``timeout`` seconds and ``MAX_BODY_BYTES``."""
    async def read() -> bytes:
        size = 0
        chunks = []
        async for chunk in http.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise RequestError(f"the request body is over {MAX_BODY_BYTES} bytes",
                                   status=413, param="body")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        data = await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        raise RequestError(f"the request body did not arrive within {timeout:g} s "
                           "(--receive-timeout)", status=408, param="body") from None
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}", param="body") from None
    except RecursionError:
        raise RequestError("the request body is nested too deeply", param="body") from None


def _longest_token(llm: LLM) -> int:
    """The most characters one token of ``llm``'s vocabulary stands for (its text, or more:
    a byte token is spelled ``<0x0A>``), so that no prompt of more than the model length
    times this could fit."""
    vocabulary = llm.tokenizer.get_vocab(with_added_tokens=True)  # type: ignore[union-attr]
    return max(map(len, vocabulary), default=1)


async def _disconnected(http: HTTPRequest) -> None:
    """Returns when the client closes the connection (the body has been read)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


@dataclass
class ConnectionBounds:
    """One server's bounds on its connections, and what it does when one is hit."""

    max_connections: int
    receive_timeout: float  # seconds
    shed: Callable[[], None]  # told of each connection a bound closes
    said: bool = False  # the one log line about it
    #: The connections open and not closed by a bound, the one that has waited longest
    #: (since it opened, or since its last answer) first: a flood of connections costs one
    #: lookup each, not a walk over all of them.
    open: dict[_GuardedH11, None] = field(default_factory=dict)


class _GuardedH11(H11Protocol):
    """uvicorn's HTTP/1.1 connection, bounded: a connection has ``receive_timeout`` seconds
    to send a request's headers (from its opening, or from the previous answer on a
    kept-alive connection), else it is closed; past ``max_connections`` open at once, the
    connection that has waited longest without a request in progress is closed (the new
    one when none is). An API key is checked only once headers have come, so neither bound
    waits for one. ``bounds`` is set on a subclass per server (:func:`_guarded_protocol`)."""

    bounds: ClassVar[ConnectionBounds]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()
        bounds = self.bounds
        if len(bounds.open) > bounds.max_connections:
            victim = next((c for c in bounds.open if c is not self and c._idle()), self)
            victim._shed(f"more than {bounds.max_connections} connections open "
                         "(--max-connections)")

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self.bounds.open.pop(self, None)
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self.bounds.open.pop(self, None)
        self.bounds.open[self] = None  # the newest to wait
        self._deadline = self.loop.call_later(self.bounds.receive_timeout, self._late)

    def _idle(self) -> bool:
        """No request in progress: waiting for one's headers, or kept alive."""
        return self.cycle is None or self.cycle.response_complete

    def _late(self) -> None:
        if self._idle():
            self._shed(f"no request within {self.bounds.receive_timeout:g} s "
                       "(--receive-timeout)")

    def _shed(self, why: str) -> None:
        bounds = self.bounds
        if not bounds.said:
            bounds.said = True
            LOG.warning("policy serve: closing a connection: %s (said once; "
                        "interlock_connections_shed_total counts them)", why)
        bounds.shed()
        bounds.open.pop(self, None)
        self.transport.close()


def _guarded_protocol(bounds: ConnectionBounds) -> type[_GuardedH11]:
    return type("GuardedH11", (_GuardedH11,), {"bounds": bounds})


class _Uvicorn(uvicorn.Server):
    """uvicorn, but a SIGTERM that drained the server ends it with status 0 (uvicorn
    raises the signal again once it has shut down), the listening line is ours, a failed
    accept() is logged once, and a drain that runs out of time ends what is still running
    (finish reason ``abort``) before uvicorn would cut the answers off."""

    def __init__(self, config: uvicorn.Config, announce: Callable[[], None],
                 loop: StepThread, drain_timeout: float) -> None:
        super().__init__(config)
        self.announce = announce
        self.step_thread, self.drain_timeout = loop, drain_timeout
        self.signals: list[int] = []
        self.aborted = 0  # requests the drain timeout ended
        self._accept_failures = 0

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: Any) -> None:
        self.signals.append(sig)
        self.handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().set_exception_handler(self._loop_exception)
        await super().startup(sockets)
        if not self.should_exit:
            self.announce()

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """asyncio retries a failed accept() every second and reports each failure with a
        traceback: under a flood of connections, one line the first time is enough."""
        if context.get("message") != _ACCEPT_EXHAUSTED:
            loop.default_exception_handler(context)
            return
        if not self._accept_failures:
            LOG.error("policy serve: cannot accept connections: %s (said once; asyncio "
                      "retries every second)", context.get("exception"))
        self._accept_failures += 1

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timer = asyncio.get_running_loop().call_later(self.drain_timeout, self._drain_ran_out)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _drain_ran_out(self) -> None:
        self.aborted = self.step_thread.in_flight()
        if self.aborted:
            self.step_thread.abort_all()


def run_server(llm: LLM, options: ServeOptions, sock: socket.socket) -> bool:
    """Serve on ``sock`` (bound) until SIGTERM or Ctrl-C, then drain; True if it ended by
    Ctrl-C (SIGINT)."""
    server = Server(llm, options)
    protocol = _guarded_protocol(ConnectionBounds(
        options.max_connections, options.receive_timeout, server.metrics.shed))
    # uvicorn cancels what is left DRAIN_GRACE s after the drain timeout has aborted it.
    config = uvicorn.Config(server.app, log_level="warning", access_log=False, lifespan="off",
                            http=protocol,
                            timeout_graceful_shutdown=options.drain_timeout + DRAIN_GRACE)
    host, port = sock.getsockname()[:2]

    def announce() -> None:
        options.announce(f"serving {', '.join(options.served)} on http://{host}:{port} "
                         "(OpenAI API under /v1, /health, /metrics)")

    uv = _Uvicorn(config, announce, server.loop, options.drain_timeout)
    server.loop.start()
    try:
        uv.run(sockets=[sock])
    finally:
        # Whatever is still admitted (uvicorn cancelled it, or it ended by an error) is
        # aborted by close().
        unfinished = server.loop.in_flight() + uv.aborted
        server.loop.close()
        server.worker.shutdown(wait=False, cancel_futures=True)
    if uv.signals and unfinished:
        options.announce(f"drain timed out after {options.drain_timeout:g} s: {unfinished} "
                         "request(s) in flight ended (finish_reason abort); stopped")
    elif uv.signals:
        options.announce("drained: the requests in flight finished; stopped")
    return signal.SIGINT in uv.signals
