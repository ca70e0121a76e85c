"""The source of a fake ``vllm`` that serves: standard library only, written to PATH by tests.

``vllm serve MODEL ... --host H --port P`` prints vLLM 0.33.0's startup lines (as
fake_vllm_engine.py does, from the env and flags it is given) and then serves
``/health`` and an OpenAI-compatible ``/v1/completions`` (streamed or not) on H:P. Each
streamed token takes ``FAKE_BASE_MS`` (default 2) + ``FAKE_V2_MS`` (default 3) ms under V2
+ 1.2 ms with breakable graphs (no interaction). Greedy answers are a function of the
prompt; ``FAKE_DIVERGE`` (e.g. ``mrv1:true``: runner mrv1 with breakable graphs) changes
them under that cell.
``FAKE_MODE=unhealthy`` never listens; ``FAKE_MODE=die`` exits at its first streamed request.
"""

SOURCE = r'''#!{python}
import json, os, signal, socket, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

argv = sys.argv[1:]
pid = os.getpid()
mode = os.environ.get("FAKE_MODE", "")


def value(name, default=None):
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def log(where, message):
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"(EngineCore pid={{pid}}) INFO {{stamp}} [{{where}}] {{message}}", flush=True)


signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
v2 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1"
breakable = os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH") == "1"
mode_name = value("-cc.mode", "VLLM_COMPILE").upper()
cudagraph = value("-cc.cudagraph_mode", "FULL_AND_PIECEWISE").upper()
v2_ms = float(os.environ.get("FAKE_V2_MS", "3"))
delay = (float(os.environ.get("FAKE_BASE_MS", "2")) + v2_ms * v2 + 1.2 * breakable) / 1e3
cell = f"{{'mrv2' if v2 else 'mrv1'}}:{{'true' if breakable else 'false'}}"
diverge = os.environ.get("FAKE_DIVERGE") == cell

log("core.py:140", "Initializing a V1 LLM engine (v0.33.0) with config: model='m', "
    f"compilation_config={{{{'mode': <CompilationMode.{{mode_name}}: 0>, "
    f"'cudagraph_mode': <CUDAGraphMode.{{cudagraph}}: 0>}}}}, kernel_config=None")
if v2:
    log("gpu_worker.py:513", "Using V2 Model Runner")
if breakable and cudagraph != "NONE":
    log("breakable_cudagraph.py:294", "Breakable CUDA graph enabled")
if mode == "unhealthy":
    time.sleep(600)


def answer(prompt, n):
    words = str(prompt).split() or ["x"]
    out = [words[i % len(words)][::-1] for i in range(n)]
    if diverge:
        out[0] = "different"
    return " " + " ".join(out)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        # Each token goes out as it is made (no Nagle batching), as a real server's does.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = int(body["max_tokens"])
        if not body.get("stream"):
            data = json.dumps({{"choices": [{{"text": answer(body["prompt"], n)}}]}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if mode == "die":
            os._exit(9)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        start = time.perf_counter()
        for i in range(n):
            # Token i is due at start + (i + 1) * delay: a late wake-up does not add up.
            time.sleep(max(0.0, start + (i + 1) * delay - time.perf_counter()))
            chunk = {{"choices": [{{"text": f" t{{i}}", "index": 0}}]}}
            self.wfile.write(f"data: {{json.dumps(chunk)}}\n\n".encode())
            self.wfile.flush()
        usage = {{"choices": [], "usage": {{"completion_tokens": n}}}}
        self.wfile.write(f"data: {{json.dumps(usage)}}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


server = ThreadingHTTPServer((value("--host", "127.0.0.1"), int(value("--port", "8000"))),
                             Handler)
log("entry.py:139", f"Starting vLLM server on http://127.0.0.1:{{value('--port')}}")
server.serve_forever()
'''
