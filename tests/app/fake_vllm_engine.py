"""The source of a fake ``vllm`` executable: standard library only, written to PATH by tests.

It prints vLLM 0.33.0's startup log lines (the messages and logger format of vLLM's own
source: ``v1/engine/core.py:140``, ``v1/worker/gpu_worker.py:513``,
``compilation/breakable_cudagraph.py:294``, ``entrypoints/launchers/api_server/entry.py:139``)
as the env and flags it was started with decide them, then serves until SIGINT or SIGTERM
(or ``FAKE_VLLM_LINGER`` seconds). ``FAKE_VLLM_MODE`` makes it misbehave:

- ``match``: what vLLM prints for the flags given;
- ``v1``: runs V1 even where ``VLLM_USE_V2_MODEL_RUNNER=1`` (no V2 line);
- ``breakable``: logs breakable graphs even where they are off;
- ``silent``: prints nothing and waits;
- ``early``: prints the config line, then exits 3;
- ``killed``: prints the config line, then is killed by SIGKILL.

``FAKE_VLLM_PIDS`` (a file): it writes its pid and its own child's (a stand-in worker it
starts) there; ``FAKE_VLLM_SIGNALS`` (a file): it appends each signal it gets.
"""

SOURCE = r'''#!{python}
import os, signal, subprocess, sys, time

mode = os.environ.get("FAKE_VLLM_MODE", "match")
argv = sys.argv[1:]
pid = os.getpid()


def log(where, message, process="EngineCore"):
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"({{process}} pid={{pid}}) INFO {{stamp}} [{{where}}] {{message}}", flush=True)


def flag(name, default):
    for arg in argv:
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1].upper()
    return default


def on_signal(signum, frame):
    path = os.environ.get("FAKE_VLLM_SIGNALS")
    if path:
        with open(path, "a") as f:
            f.write(signal.Signals(signum).name + "\n")
    if worker is not None:
        worker.terminate()
        worker.wait()
    sys.exit(128 + signum)


signal.signal(signal.SIGINT, on_signal)
signal.signal(signal.SIGTERM, on_signal)
worker = None
if os.environ.get("FAKE_VLLM_PIDS"):
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["FAKE_VLLM_PIDS"], "w") as f:
        f.write(f"{{pid}} {{worker.pid}}\n")

v2 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1" and mode != "v1"
breakable = os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH") == "1" or mode == "breakable"
mode_name = flag("-cc.mode", "VLLM_COMPILE")
mode_value = {{"NONE": 0, "VLLM_COMPILE": 3}}.get(mode_name, 3)
cudagraph = flag("-cc.cudagraph_mode", "FULL_AND_PIECEWISE")
cg_value = {{"NONE": "0", "PIECEWISE": "1", "FULL": "2", "FULL_DECODE_ONLY": "(2, 0)",
            "FULL_AND_PIECEWISE": "(2, 1)"}}[cudagraph]

if mode == "silent":
    time.sleep(float(os.environ.get("FAKE_VLLM_LINGER", "60")))
    sys.exit(0)
print("some unrelated output", file=sys.stderr, flush=True)
log("core.py:140",
    "Initializing a V1 LLM engine (v0.33.0) with config: model='m', "
    "speculative_config=None, tokenizer='m', dtype=torch.bfloat16, seed=0, "
    f"compilation_config={{{{'mode': <CompilationMode.{{mode_name}}: {{mode_value}}>, "
    "'debug_dump_path': None, 'backend': 'inductor', "
    f"'cudagraph_mode': <CUDAGraphMode.{{cudagraph}}: {{cg_value}}>, "
    "'cudagraph_num_of_warmups': 1}}, kernel_config=KernelConfig()")
if mode == "early":
    sys.exit(3)
if mode == "killed":
    os.kill(pid, signal.SIGKILL)
if v2:
    log("gpu_worker.py:513", "Using V2 Model Runner")
if breakable and cudagraph != "NONE":
    log("breakable_cudagraph.py:294", "Breakable CUDA graph enabled")
log("entry.py:139", "Starting vLLM server on http://0.0.0.0:8000", process="APIServer")
time.sleep(float(os.environ.get("FAKE_VLLM_LINGER", "60")))
if worker is not None:
    worker.terminate()
sys.exit(0)
'''
