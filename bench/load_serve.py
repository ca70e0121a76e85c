"""`policy serve` under a slowloris load: the latency of 8 real clients alone, and while
1,000 connections are held open with unfinished headers (issue 51).

One `policy serve --model M` child on 127.0.0.1 (a free port, its default bounds unless
--max-connections is given: 2048 connections, --receive-timeout 10 s) serves every phase.
A phase runs the 8 real clients (each sends --requests greedy /v1/completions of
--output-len tokens, one after another); a loaded phase runs them, again and again for at
least --hold seconds (past the receive timeout, so that it closes held connections while
clients are measured), while a holder keeps --held connections open, each having sent the
first line of a request and nothing more, and opens a new one whenever the server closes
one. The holder is bounded in count (--held at once, --max-opens in all) and in time (its
phase). Phases alternate, unloaded first; the medians of the requests' latencies are
reported, with how many held connections the server closed and the descriptors it had
open (from /proc), beside the load average (the machine is shared).

    .venv/bin/python bench/load_serve.py [--model smollm2] [--held 1000] [--clients 8]
        [--requests 4] [--output-len 16] [--hold 15] [--rounds 2] [--max-connections N]
        [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LISTENING = re.compile(r"serving .* on http://(127\.0\.0\.1):(\d+) ")
PARTIAL = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"


class Server:
    """A `policy serve` child on a free port of 127.0.0.1."""

    def __init__(self, model: str, clients: int, bounds: list[str]) -> None:
        self.child = subprocess.Popen(
            [sys.executable, "-m", "interlock.cli", "serve", "--model", model, "--host",
             "127.0.0.1", "--port", "0", "--max-num-seqs", str(clients), *bounds],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            stdin=subprocess.DEVNULL)
        self.port = 0
        self.lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.child.stdout is not None
            for line in self.child.stdout:
                self.lines.append(line.rstrip("\n"))
                found = LISTENING.search(line)
                if found:
                    self.port = int(found.group(2))
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        ready.wait(600)
        if not self.port:
            self.stop()
            raise SystemExit("policy serve did not come up:\n" + "\n".join(self.lines[-20:]))

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.child.pid}/fd"))

    def shed(self) -> float:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("interlock_connections_shed_total"))

    def stop(self) -> None:
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
            try:
                self.child.wait(120)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()


def clients(port: int, model: str, count: int, requests: int, output_len: int) -> list[float]:
    """Seconds per request of ``count`` clients sending ``requests`` each, in turn."""
    latencies: list[float] = []
    errors: list[str] = []
    body = json.dumps({"model": model, "prompt": "The capital of France is",
                       "max_tokens": output_len, "temperature": 0, "ignore_eos": True})

    def client() -> None:
        for _ in range(requests):
            start = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            try:
                conn.request("POST", "/v1/completions", body,
                             {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    errors.append(f"status {response.status}")
            except OSError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                conn.close()
            latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=client) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise SystemExit(f"real clients failed: {errors[:5]} ({len(errors)} in all)")
    return latencies


def measured(into: list[float], until: float, port: int, args: argparse.Namespace) -> None:
    """The real clients' workload, again and again until ``until`` has passed."""
    while time.monotonic() < until:
        into.extend(clients(port, args.model, args.clients, args.requests, args.output_len))


class Holder:
    """``held`` connections that send a request's first line and stop, reopened when the
    server closes them, until ``stop`` or ``max_opens`` opens."""

    def __init__(self, port: int, held: int, max_opens: int) -> None:
        self.port, self.held, self.max_opens = port, held, max_opens
        self.opens = self.closed_by_server = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Holder:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _open(self, selector: selectors.BaseSelector) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", self.port))
        selector.register(sock, selectors.EVENT_WRITE, "connecting")
        self.opens += 1

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        try:
            while not self._stop.is_set():
                while len(selector.get_map()) < self.held and self.opens < self.max_opens:
                    self._open(selector)
                self.peak = max(self.peak, len(selector.get_map()))
                for key, _ in selector.select(timeout=0.2):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if key.data == "connecting":
                        try:
                            sock.send(PARTIAL)
                            selector.modify(sock, selectors.EVENT_READ, "held")
                            continue
                        except OSError:
                            pass
                    else:
                        try:
                            if sock.recv(4096):
                                continue  # an answer: the connection stays until closed
                        except OSError:
                            pass
                        self.closed_by_server += 1
                    selector.unregister(sock)
                    sock.close()
        finally:
            for key in list(selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            selector.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--held", type=int, default=1000)
    parser.add_argument("--max-opens", type=int, default=200_000,
                        help="connections the holder opens in all, at most")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=4, help="requests per client")
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--hold", type=float, default=15.0,
                        help="seconds a loaded phase lasts at least")
    parser.add_argument("--max-connections", type=int,
                        help="the server's --max-connections (default: its own)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    bounds = [] if args.max_connections is None else [
        "--max-connections", str(args.max_connections)]
    server = Server(args.model, args.clients, bounds)
    alone: list[float] = []
    loaded: list[float] = []
    held: list[dict[str, int]] = []
    descriptors: list[int] = []  # the server's open descriptors, sampled under load
    try:
        clients(server.port, args.model, 1, 1, 4)  # warm-up
        for _ in range(args.rounds):
            alone += clients(server.port, args.model, args.clients, args.requests,
                             args.output_len)
            shed_before = server.shed()
            with Holder(server.port, args.held, args.max_opens) as holder:
                while holder.peak < args.held and holder.opens < args.max_opens:
                    time.sleep(0.1)
                work = threading.Thread(target=measured, args=(
                    loaded, time.monotonic() + args.hold, server.port, args))
                work.start()
                while work.is_alive():
                    descriptors.append(server.descriptors())
                    work.join(0.2)
            held.append({"opened": holder.opens, "held_at_once": holder.peak,
                         "closed_by_server": holder.closed_by_server,
                         "shed_by_server": int(server.shed() - shed_before)})
        answered = server.child.poll() is None
    finally:
        server.stop()
    load_after = os.getloadavg()
    result = {
        "model": args.model, "clients": args.clients, "requests_per_client": args.requests,
        "output_len": args.output_len, "held": args.held, "rounds": args.rounds,
        "hold_s": args.hold, "max_connections": args.max_connections or "default",
        "requests_alone": len(alone), "requests_loaded": len(loaded),
        "median_s_alone": round(statistics.median(alone), 3),
        "median_s_loaded": round(statistics.median(loaded), 3),
        "p90_s_alone": round(statistics.quantiles(alone, n=10)[-1], 3),
        "p90_s_loaded": round(statistics.quantiles(loaded, n=10)[-1], 3),
        "server_descriptors_median": statistics.median(descriptors),
        "server_descriptors_peak": max(descriptors), "holder": held, "server_up": answered,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }
    result["loaded_vs_alone"] = round(result["median_s_loaded"] / result["median_s_alone"], 2)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{args.model}: {args.clients} clients x {args.requests} requests of "
          f"{args.output_len} tokens, {args.rounds} rounds; {args.held} held connections "
          f"for {args.hold:g} s or more; --max-connections {result['max_connections']}")
    print(f"median latency alone {result['median_s_alone']} s, with the held connections "
          f"{result['median_s_loaded']} s ({result['loaded_vs_alone']}x); p90 "
          f"{result['p90_s_alone']} s / {result['p90_s_loaded']} s")
    print(f"server's open descriptors under load: median {result['server_descriptors_median']}"
          f", at most {result['server_descriptors_peak']} (a burst being accepted); holder "
          f"per round: {held}")
    print(f"load average (1, 5, 15 min): before {result['loadavg_before']}, "
          f"after {result['loadavg_after']}")


if __name__ == "__main__":
    main()
