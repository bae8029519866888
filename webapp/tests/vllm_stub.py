"""A stand-in for ``.venv-vllm``, so ``bin/vllm`` and ``PSYEVO_BACKEND=vllm bin/up`` run
for real (their scripts, the supervisor, signals, process groups) without vLLM.

``make_stub_venv`` builds a virtual environment without pip whose install stamp matches
what ``bin/vllm`` expects (so it installs nothing) and whose ``vllm`` package has one
module, ``vllm.entrypoints.openai.api_server``: a small HTTP server that answers
``/health`` and ``/v1/models`` and, like vLLM's API process, has a child of its own (the
"engine core") in its process group. That child ignores SIGTERM, so only a stop that
ends the whole group ends it. With ``STAND_IN_IGNORE_TERM=1`` the server ignores
SIGTERM too (only SIGKILL after the grace period ends it). With ``STAND_IN_RECORD`` set,
the server writes its PID, its engine's PID and its arguments there as JSON once it
listens."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

API_SERVER = '''
"""Stand-in for vLLM's OpenAI-compatible server (webapp/tests/vllm_stub.py)."""
import argparse, http.server, json, os, signal, subprocess, sys, time

parser = argparse.ArgumentParser()
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, default=8001)
parser.add_argument("--served-model-name", default="stand-in")
args, _ = parser.parse_known_args()
if os.environ.get("STAND_IN_IGNORE_TERM") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
engine = subprocess.Popen([
    sys.executable, "-c",
    "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    "while True: time.sleep(1)",
])


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _json(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": args.served_model_name}]})
        else:
            self._json(404, {"error": {"message": "no route", "code": 404}})


server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
record = os.environ.get("STAND_IN_RECORD")
if record:
    with open(record + ".tmp", "w") as f:
        json.dump({"server": os.getpid(), "engine": engine.pid, "argv": sys.argv[1:]}, f)
    os.replace(record + ".tmp", record)
server.serve_forever()
'''


def install_stamp() -> str:
    """The recipe line ``bin/vllm`` compares with ``<venv>/.psyevo-vllm-installed``."""
    script = (ROOT / "bin" / "vllm").read_text()
    version = re.search(r"PSYEVO_VLLM_VERSION:-([^}]+)\}", script)
    torch = re.search(r"^TORCH_CPU_VERSION=(\S+)", script, re.M)
    assert version and torch, "bin/vllm no longer names its versions where expected"
    nvidia = shutil.which("nvidia-smi")
    gpu = bool(nvidia) and subprocess.run([str(nvidia), "-L"], capture_output=True).returncode == 0
    return f"vllm={version[1]} flavour={'gpu' if gpu else 'cpu'} torch={torch[1]}"


def make_stub_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    (site,) = path.glob("lib/python3*/site-packages")
    package = site / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (site / "vllm", site / "vllm" / "entrypoints", package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(API_SERVER)
    (path / ".psyevo-vllm-installed").write_text(install_stamp() + "\n")
    return path


def stub_model(path: Path) -> Path:
    """A model folder the supervisor accepts (it checks for config.json only)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    return path


def group_members(pgid: int) -> set[int]:
    """Living processes (not zombies) of process group ``pgid``, read from /proc."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.add(int(entry.name))
    return found
