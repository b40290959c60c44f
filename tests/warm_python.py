"""`python SCRIPT ARGS` for the tests, without paying torch's import each time.

On this 2-core machine `python train.py --help` takes 4.4 s, 3.4 s of it importing torch and torchvision (which
pulls in torch._dynamo): most of a tiny test run, and the suite starts train.py dozens of times. `run()` here forks a
server process that imported them once and never ran a torch op, and the fork then does what `python SCRIPT ARGS`
does: its own argv, working directory, environment, stdin/stdout/stderr, the script run as `__main__` (runpy), and
the interpreter's own exit (atexit handlers, exit code, sys.excepthook for an uncaught exception).

Not imported in the server on purpose: cv2 (its thread pool does not survive a fork, pitfall D7) and this repo's
modules (every run imports them afresh, as a new process does). Environments that change what those imports read
(PYTHON*, OMP_*, MKL_*, TORCH_*, CUDA_*) and anything beyond cwd/env/timeout get a real subprocess instead, and so do
the tests that signal, kill or launch processes (torchrun, srun): they start `python` themselves.
"""

import atexit
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import time

IMPORT_TIME_PREFIXES = ("PYTHON", "OMP_", "MKL_", "TORCH", "CUDA_", "LD_")


def serve():
    """The server: one request per line on stdin, answered with the child's pid, then its exit code."""
    import matplotlib  # noqa: F401  the slow imports, once; none of them starts a torch thread pool
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torchvision  # noqa: F401
    import yaml  # noqa: F401

    requests = os.fdopen(0, "rb", buffering=0)
    while line := readline(requests.fileno(), None):
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            become(request)  # leaves through the interpreter's exit, with the script's exit code
        os.write(1, (json.dumps({"pid": pid}) + "\n").encode())
        _, status = os.waitpid(pid, 0)
        os.write(1, (json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n").encode())


def become(request):
    """In the fork: turn into `python SCRIPT ARGS` and run it. An uncaught exception leaves through the interpreter,
    which prints it with sys.excepthook (train.py's crash handler sees it) and exits with 1, as it would."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(os.open(request["stdout"], os.O_WRONLY), 1)
    os.dup2(os.open(request["stderr"], os.O_WRONLY), 2)
    # as the interpreter opens them for files: stdout block-buffered, stderr by line
    sys.stdin, sys.stdout, sys.stderr = (
        open(0, closefd=False),
        open(1, "w", closefd=False),
        open(2, "w", 1, closefd=False),
    )
    signal.signal(signal.SIGINT, signal.default_int_handler)
    script = os.path.abspath(request["script"])
    sys.argv = [request["script"], *request["args"]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")
    sys.exit(0)


def readline(fd, deadline):
    """One line from a raw pipe, waiting until the deadline (None: forever); b"" at its end or past the deadline."""
    data = b""
    while not data.endswith(b"\n"):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([fd], [], [], left)[0]:
            return b""
        chunk = os.read(fd, 1)
        if not chunk:
            return b""
        data += chunk
    return data


_server, _server_env = None, None


def import_time(env):
    """The variables of `env` that what the server imported has read already (torch's OpenMP threads among them)."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)}


def _start(env):
    """The server, started again when the import-time environment changed since it started: a library imported in
    this worker may set one (`import paddle` sets OMP_NUM_THREADS=1), and a fork of a server that read the old value
    would run with other threads than a `python` started now (other float sums: not bitwise)."""
    global _server, _server_env
    if _server is not None and _server.poll() is None and import_time(env) != _server_env:
        _server.kill()
        _server.wait()
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen(
            [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env
        )
        _server_env = import_time(env)
        atexit.register(_server.kill)
    return _server


def run(cmd, cwd, env=None, timeout=300):
    """subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout) for cmd =
    [sys.executable, SCRIPT, *ARGS]: the same CompletedProcess, from a fork of the server."""
    env = dict(os.environ if env is None else env)
    if cmd[0] != sys.executable or any(
        env.get(k) != os.environ.get(k) for k in {*env, *os.environ} if k.startswith(IMPORT_TIME_PREFIXES)
    ):
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    server = _start(env)
    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        for path in (out, err):
            open(path, "w").close()
        request = {"script": str(cmd[1]), "args": list(map(str, cmd[2:])), "cwd": str(cwd), "env": env}
        server.stdin.write((json.dumps({**request, "stdout": out, "stderr": err}) + "\n").encode())
        pid = json.loads(readline(server.stdout.fileno(), None))["pid"]
        answer = readline(server.stdout.fileno(), time.monotonic() + timeout)
        if not answer:
            os.kill(pid, signal.SIGKILL)
            readline(server.stdout.fileno(), None)
            raise subprocess.TimeoutExpired(cmd, timeout)
        returncode = json.loads(answer)["returncode"]
        return subprocess.CompletedProcess(cmd, returncode, open(out).read(), open(err).read())


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    serve()
