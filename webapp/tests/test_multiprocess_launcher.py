"""scripts.cluster: the Procfile's command lines, and a teardown that leaves nothing behind."""

from __future__ import annotations

import os
import sys

import pytest

from scripts.cluster import Cluster, ClusterError, expand, procfile_commands


def test_it_runs_the_procfile_lines_with_this_interpreter_and_the_given_port() -> None:
    commands = procfile_commands()
    web = expand(commands["web"], {"WEB_HOST": "127.0.0.1", "WEB_PORT": "8123"})
    assert web[:3] == [sys.executable, "-m", "daphne"]
    assert web[web.index("-p") + 1] == "8123" and web[-1] == "webapp.asgi:application"
    training = expand(commands["training"], {})
    assert training[:3] == [sys.executable, "-m", "celery"]
    assert "training_worker.tasks" in training and training[training.index("-Q") + 1] == "training"


def test_it_gives_each_worker_its_own_node_name_and_the_servers_their_ports() -> None:
    cluster = Cluster(asgi=2, workers=("default", "training"), ports=[8301, 8302])
    assert cluster.urls == ["http://127.0.0.1:8301", "http://127.0.0.1:8302"]
    assert cluster.ws_urls[1] == "ws://127.0.0.1:8302"
    nodes = {cluster.worker_proc(q).node for q in ("default", "training")}
    assert len(nodes) == 2 and all(cluster.tag in (n or "") for n in nodes)
    assert cluster.full_env["CHANNELS_PREFIX"] == f"psyevo-cluster-{cluster.tag}"


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"workers": ("gpu",)}, "unknown worker queue"),
        ({"asgi": 2, "ports": [8000]}, "1 ports for 2 ASGI servers"),
        ({"asgi": -1}, "asgi must be"),
    ],
)
def test_it_refuses_a_bad_layout(kwargs, problem) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=problem):
        Cluster(**kwargs)


def test_a_process_that_cannot_start_fails_the_start_and_leaves_no_process(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster(
        asgi=1,
        workers=("default",),
        env={"WS_RATE_LIMIT": "not-a-number"},  # settings refuse to load: every process exits
        log_dir=tmp_path,
        start_timeout=60,
    )
    with pytest.raises(ClusterError, match="exited"), cluster:
        pass
    for proc in cluster.procs.values():
        assert proc.popen is not None and proc.popen.poll() is not None
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.popen.pid, 0)  # the whole process group is gone
    assert "WS_RATE_LIMIT" in cluster.asgi_proc(0).log_tail()


def test_a_supervised_cluster_restarts_what_exits_on_its_own_but_not_what_it_killed(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    import time

    from scripts.cluster import Proc

    cluster = Cluster(asgi=0, workers=(), log_dir=tmp_path, wait_healthy=False, supervise=True)
    crasher = [sys.executable, "-c", "import time; time.sleep(0.2); raise SystemExit(3)"]
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    cluster.procs["crasher"] = Proc("crasher", crasher, tmp_path / "crasher.log")
    cluster.procs["sleeper"] = Proc("sleeper", sleeper, tmp_path / "sleeper.log")
    with cluster:
        cluster.procs["sleeper"].kill()  # a fault injected on purpose stays down
        deadline = time.monotonic() + 30
        while cluster.procs["crasher"].restarts < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert cluster.procs["crasher"].restarts >= 2
        assert not cluster.procs["sleeper"].alive and cluster.procs["sleeper"].restarts == 0
        assert set(cluster.restarts) == {"crasher"}
    restarted = cluster.restarts["crasher"]
    time.sleep(2.5)
    assert cluster.restarts["crasher"] == restarted  # a stopped cluster restarts nothing
