"""`--tokenization-priority` and `--tokenization-workers`: the scheduling class and number of
the router's tokenizer threads, read from /proc (Linux). By default there is one per core;
where the runtime has an interactive lane (a GPU) they yield their cores to every other
thread, and on a CPU, where the forward pass's own threads would otherwise starve them,
they share every core normally."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="scheduling classes are Linux's")

SCHED_OTHER, SCHED_IDLE = 0, 5
LANE_BACKEND = ["--python-backend-class", "backends:LaneClaimingBackend"]


def tokenizer_thread_count(pid: int) -> int:
    return sum(
        (task / "comm").read_text().startswith("tokenizer-")
        for task in Path(f"/proc/{pid}/task").iterdir()
    )


def tokenizer_thread_classes(pid: int) -> list[int]:
    """The scheduling class of each of the process's `tokenizer-N` threads."""
    classes = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if not (task / "comm").read_text().startswith("tokenizer-"):
                continue
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # the thread has exited
            continue
        classes.append(int(stat[stat.rindex(")") + 2 :].split()[38]))
    return classes


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], SCHED_OTHER),  # a CPU runtime: no interactive lane
        (LANE_BACKEND, SCHED_IDLE),
        (["--tokenization-priority", "idle"], SCHED_IDLE),
        (["--tokenization-priority", "normal", *LANE_BACKEND], SCHED_OTHER),
    ],
    ids=["cpu-default", "lane-default", "idle", "normal-over-lane"],
)
def test_tokenizer_threads_run_in_the_class_asked_for(start_server, minilm_dir, flags, expected):
    server = start_server(minilm_dir, *flags)
    # A backfill-sized request goes through the pool; the server still answers.
    response = server.post("/embed", {"inputs": ["word " * 600] * 2, "truncate": True})
    assert response.status_code == 200, response.text
    classes = tokenizer_thread_classes(server.proc.pid)
    assert classes and set(classes) == {expected}, classes


def test_an_unknown_priority_is_refused_at_start(minilm_dir, tmp_path):
    from router_harness import Server

    with pytest.raises(RuntimeError) as err:
        Server(minilm_dir, tmp_path, "--tokenization-priority", "high")
    assert "invalid value 'high'" in str(err.value) and "normal" in str(err.value)


def test_the_pool_has_a_thread_per_core_unless_told(start_server, minilm_dir):
    def pool(*flags: str) -> int:
        server = start_server(minilm_dir, *flags, default_pool=True)
        workers = server.get("/info").json()["tokenization_workers"]
        assert tokenizer_thread_count(server.proc.pid) == workers
        return workers

    cores = pool()  # a CPU runtime: one thread per core the router may use
    assert cores >= 1
    assert pool(*LANE_BACKEND) == cores
    assert pool("--tokenization-workers", "3", *LANE_BACKEND) == 3
