"""A managed OpenAI-compatible inference server: started on a model directory, stopped afterwards.

Inference is kept apart from training: the sample and evaluate stages start a server on the model
they sample (`vllm serve DIR` where a GPU and vLLM exist, `transformers serve DIR` otherwise), wait
until it answers, and stop it when the stage ends, so each iteration samples the model it just
promoted. The server is an existing engine; this module only runs and watches its process.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from closedloop.sampling.base import SamplingError


@dataclass
class ServerProcess:
    url: str  # base URL, ending in /v1
    model: str  # the name requests must carry
    kind: str  # "vllm" | "transformers"
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the server's whole process group: a server may have forked workers."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=grace_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait()
        shutil.rmtree(self.log_path.parent, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_kind(command: str, device: str) -> str:
    """What a managed server runs: vLLM on a GPU when it is installed, transformers otherwise."""
    if command != "auto":
        return command
    if device == "cpu":
        return "transformers"
    has_vllm = shutil.which("vllm") is not None or (Path(sys.executable).parent / "vllm").exists()
    return "vllm" if has_vllm and _cuda_available() else "transformers"


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


def _executable(name: str) -> str:
    # The console script of this environment first: `make` runs without activating .venv.
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise SamplingError(f"sample.server.command: {name!r} is not installed (no {name} executable on PATH)")
    return found


def server_command(kind: str, model_dir: Path, port: int, params: Any) -> list[str]:
    model = params.model
    if kind == "vllm":
        command = [_executable("vllm"), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
                   "--served-model-name", str(model_dir), "--seed", str(params.project.seed),
                   # Log-probabilities after temperature, as GRPO's policy ratio needs (vLLM's default
                   # returns them before it).
                   "--logprobs-mode", "processed_logprobs"]
        if model.dtype != "auto":
            command += ["--dtype", model.dtype]
        return command
    device = model.device if model.device != "auto" else ("cuda" if _cuda_available() else "cpu")
    return [_executable("transformers"), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
            "--device", device, "--dtype", "float32" if model.dtype == "auto" and device == "cpu" else model.dtype]


def start_server(model_dir: Path, params: Any) -> ServerProcess:
    """Start a server on ``model_dir`` and return once it answers /v1/models, or fail with its log."""
    settings = params.sample.server
    kind = server_kind(settings.command, params.model.device)
    port = settings.port or free_port()
    command = server_command(kind, Path(model_dir), port, params)
    log_dir = Path(tempfile.mkdtemp(prefix="closedloop-server-"))
    log_path = log_dir / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, start_new_session=True, preexec_fn=_die_with_parent)
    server = ServerProcess(url=f"http://127.0.0.1:{port}/v1", model=str(model_dir), kind=kind, process=process,
                           log_path=log_path)
    try:
        _wait_ready(server, settings.startup_timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def _die_with_parent() -> None:
    """In the server's process, before exec: the kernel sends it SIGTERM when the stage that started
    it dies, even by SIGKILL, so a killed run leaves no server holding its port and memory (Linux)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the stage's own cleanup still stops it
        pass


def _wait_ready(server: ServerProcess, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise SamplingError(
                f"the managed {server.kind} server on {server.model} exited with code {server.process.returncode} "
                f"before it was ready; its last output:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise SamplingError(
        f"the managed {server.kind} server at {server.url} was not ready after {timeout_s:.0f} s "
        f"(sample.server.startup_timeout_s); its last output:\n{server.log_tail()}")
