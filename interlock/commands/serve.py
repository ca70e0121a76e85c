"""``policy serve --model M``: the policy decides how to run M, then an OpenAI-compatible
HTTP server answers from it (:mod:`interlock.serve`).

The decision is resolved as ``policy run`` resolves it (``interlock.app.query.decide_query``), and
one line on stderr names who chose the runner, cudagraph mode and breakable. Everything that
can be refused is checked before the model loads: the policy, the model's name and its
tokenizer, and the address (a port in use is an input error, exit 1, naming it). torch,
Starlette and uvicorn are imported only inside ``run``.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from interlock.commands.common import (
    add_context_flags,
    add_decision_log_args,
    add_policy_args,
    load,
    natural,
    positive,
    query_of,
    record_decision,
)
from interlock.core.decision import DTYPE_CHOICES, WEIGHTS
from interlock.core.env import API_KEY
from interlock.core.errors import InputError, ModelError
from interlock.serve import MAX_CONNECTIONS, MAX_LOGPROBS

#: Open files besides the connections: the model's, the listening socket, the logs, and a
#: burst of connections accepted before the bound closes them.
RESERVED_DESCRIPTORS = 512

if TYPE_CHECKING:
    from interlock.llm import LLM
    from interlock.policy.resolution import Resolution


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API, run the way the policy decides",
        description="Resolve the decision for the model (as `policy run` does), load it through "
        "the runner plugin the decision names, and serve /v1/completions, "
        "/v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /ping, /version and "
        "/metrics until SIGTERM or Ctrl-C, which drain the requests in flight. Exit 0 after "
        "a SIGTERM drain, 1 a policy or input error (a port in use too), 2 usage, 4 a model "
        "error, 130 Ctrl-C.",
    )
    parser.add_argument(
        "--model", required=True, metavar="PATH|NAME",
        help="a Hugging Face model directory, a GGUF file or a named model (smollm2); it "
        "needs a tokenizer.json",
    )
    parser.add_argument(
        "--served-model-name", metavar="NAME",
        help="the name clients give as `model` (default: the --model argument)",
    )
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=_port, default=8000, metavar="P",
                        help="port to listen on (default: 8000; 0: one the system picks)")
    parser.add_argument(
        "--api-key", metavar="KEY",
        help=f"require `Authorization: Bearer KEY` on /v1 (default: ${API_KEY.name}, else "
        "none); prefer the variable: a command line is visible to other users",
    )
    parser.add_argument("--max-num-seqs", type=positive, default=16, metavar="N",
                        help="requests in the running batch at most (default: 16)")
    parser.add_argument("--max-queue", type=natural, default=64, metavar="N",
                        help="requests admitted beyond the running batch; past that a request "
                        "is answered 503 (default: 64)")
    parser.add_argument("--max-model-len", type=positive, metavar="N",
                        help="prompt plus generated tokens at most (default: the model's)")
    parser.add_argument("--drain-timeout", type=positive, default=60, metavar="S",
                        help="seconds SIGTERM waits for requests in flight before ending them "
                        "with finish_reason abort (default: 60)")
    parser.add_argument("--max-logprobs", type=natural, default=MAX_LOGPROBS, metavar="N",
                        help="logprobs / top_logprobs a request may ask for at most; more is a "
                        f"400 (default: {MAX_LOGPROBS}, as vLLM)")
    parser.add_argument("--max-connections", type=positive, default=MAX_CONNECTIONS, metavar="N",
                        help="connections open at once at most; past it the one that has "
                        f"waited longest without a request is closed (default: {MAX_CONNECTIONS})")
    parser.add_argument("--receive-timeout", type=positive, default=10, metavar="S",
                        help="seconds a connection has to send a request's headers, and then "
                        "its body (default: 10)")
    parser.add_argument(
        "--generation-config", choices=("auto", "vllm"), default="auto",
        help="auto: the model's own sampling defaults (generation_config.json, GGUF "
        "metadata, or its named-model entry) under a request's fields; vllm: vLLM's neutral "
        "ones (temperature 1.0, ...) (default: auto, as vLLM)",
    )
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                        help="model dtype (auto: the checkpoint's)")
    parser.add_argument("--weights", choices=WEIGHTS, default="auto",
                        help="a GGUF file's quantized weights, as for `policy run`")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="seeds the requests that bring no seed")
    add_context_flags(parser)
    add_policy_args(parser)
    add_decision_log_args(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from interlock.app.decided_by import decided_by
    from interlock.app.generation_config import generation_defaults
    from interlock.app.query import decide_query

    try:
        from interlock.serve.app import ServeOptions, run_server
        from interlock.serve.metrics import decision_labels
    except ImportError as exc:
        raise InputError(
            f"policy serve needs the serve extra ({exc.name} is missing): "
            "pip install 'interlock[serve]'"
        ) from None
    policy = load(args)
    query = query_of(args, policy, runs_here=True)
    model = str(query.model)
    if not (Path(model) / "tokenizer.json").is_file():  # demo, or a folder without one
        raise ModelError(f"--model {args.model}: policy serve needs the model's "
                         "tokenizer.json (the OpenAI API answers with text); it has none")
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY.name)
    if api_key is not None and not api_key.strip():
        raise InputError(f"the API key (--api-key or ${API_KEY.name}) is empty")
    defaults, source = ({}, None) if args.generation_config == "vllm" else \
        generation_defaults(args.model, Path(model))
    allow_descriptors(args.max_connections)
    sock = bind(args.host, args.port)
    try:
        resolution = decide_query(policy, query)
        print(f"policy serve: {decided_by(resolution)}", file=sys.stderr, flush=True)
        record_decision(args, resolution, "policy serve", model=args.model,
                        overrides=dict(query.overrides))
        if source is not None:
            shown = ", ".join(f"{k}={v}" for k, v in defaults.items())
            print(f"policy serve: sampling defaults from {source}: {shown} (a request's own "
                  "fields win; --generation-config vllm for vLLM's neutral ones)",
                  file=sys.stderr, flush=True)
        llm = _load(args, model, resolution)
        options = ServeOptions(
            served=[args.served_model_name or args.model], api_key=api_key,
            max_queue=args.max_queue, drain_timeout=args.drain_timeout,
            decision=decision_labels(resolution),
            announce=lambda line: print(f"policy serve: {line}", file=sys.stderr, flush=True),
            max_logprobs=args.max_logprobs, max_connections=args.max_connections,
            receive_timeout=args.receive_timeout, sampling_defaults=defaults,
        )
        interrupted = run_server(llm, options, sock)
    finally:
        sock.close()
    llm.close()
    if interrupted:
        raise KeyboardInterrupt
    return 0


def allow_descriptors(max_connections: int) -> None:
    """Raise this process's soft limit on open files to what ``max_connections`` needs
    (as vLLM raises it), up to the hard limit; a bound the hard limit cannot hold is
    refused, naming both. An accept() past the limit would fail instead (said once)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + RESERVED_DESCRIPTORS
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise InputError(
            f"--max-connections {max_connections}: needs {needed} open files, and this "
            f"process may open at most {hard} (ulimit -Hn); lower --max-connections"
        )
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, before anything slow runs: an address in use or not
    of this machine is refused at once, naming it."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise InputError(f"--host {host}: not an address here: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise InputError(
                f"--port {port}: {host}:{port} is in use (another server?); choose another "
                "port, or --port 0 for a free one"
            ) from None
        raise InputError(f"--host {host} --port {port}: cannot listen there: "
                         f"{exc.strerror or exc}") from None
    return sock


def _load(args: argparse.Namespace, model: str, resolution: Resolution) -> LLM:
    from interlock.core.platform import device_for
    from interlock.llm import LLM

    return LLM(
        model, dtype=args.dtype, weights=args.weights,
        device=device_for(resolution.context.platform), seed=args.seed,
        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
        decision=resolution.decision, settings=args.settings,  # read where serve started
    )


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0..65535)")
    return int(text)
