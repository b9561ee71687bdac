"""Where a process's CPU time goes, by thread: the router's threads are named (`model-backend`,
`model-backend-1`, `tokenizer-3`, `router-http`, tokio's `tokio-runtime-w`), so reading every
thread's CPU time from /proc before and after a window says which part is busy, without a
profiler or ptrace rights.

    before = ThreadCpu.read(pid)
    ...                                   # the window
    print(ThreadCpu.read(pid).since(before).summary())

Threads are grouped by name with a trailing index dropped (`tokenizer-0` … `tokenizer-11` are
one group): each group's figure is CPU seconds per wall second (1.00 = one core busy), with its
busiest thread beside it. `ThreadStates` samples what chosen threads wait in (a lock, a
driver call) while a window runs. Linux only.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
INDEX = re.compile(r"[-_:]?\d+$")


def group_of(name: str) -> str:
    """`tokenizer-11` -> `tokenizer`; `model-backend-3` -> `model-backend`."""
    return INDEX.sub("", name) or name


@dataclass
class ThreadCpu:
    """CPU seconds (user + system) of each thread of one process at one instant."""

    at: float
    seconds: dict[int, tuple[str, float]] = field(default_factory=dict)

    @classmethod
    def read(cls, pid: int) -> ThreadCpu:
        out = cls(time.monotonic())
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:  # the thread ended meanwhile
                continue
            # The name is in parentheses and may hold spaces: fields after it are fixed.
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            utime, stime = int(fields[11]), int(fields[12])
            out.seconds[int(task.name)] = (name, (utime + stime) / TICKS)
        return out

    def since(self, before: ThreadCpu) -> Window:
        wall = self.at - before.at
        groups: dict[str, list[float]] = defaultdict(list)
        for tid, (name, cpu) in self.seconds.items():
            start = before.seconds.get(tid, (name, 0.0))[1]
            groups[group_of(name)].append((cpu - start) / wall)
        return Window(wall, dict(groups))


@dataclass
class Window:
    wall_s: float
    # group -> each thread's CPU seconds per wall second
    busy: dict[str, list[float]]

    def total(self) -> float:
        return sum(sum(v) for v in self.busy.values())

    def summary(self, top: int = 8) -> str:
        """`tokenizer ×12 3.41 (max 0.31); model-backend ×4 3.70 (max 0.95); …`"""
        rows = sorted(self.busy.items(), key=lambda kv: -sum(kv[1]))[:top]
        parts = [
            f"{name} ×{len(v)} {sum(v):.2f} (max {max(v):.2f})"
            if len(v) > 1
            else f"{name} {v[0]:.2f}"
            for name, v in rows
        ]
        return f"{self.total():.2f} cores over {self.wall_s:.1f} s: " + "; ".join(parts)


# x86-64 system call numbers a waiting router thread is seen in.
SYSCALLS = {"202": "futex", "16": "ioctl", "7": "poll", "232": "epoll_wait", "0": "read"}


def first_threads(pid: int, prefix: str) -> list[Path]:
    """The threads named `prefix…` that were started under that name: a thread takes the name
    of the thread that starts it, so torch's pool threads started by `model-backend-1` are
    also `model-backend-1`; of each name the lowest thread id is the one that came first."""
    first: dict[str, Path] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        if name.startswith(prefix) and (
            name not in first or int(task.name) < int(first[name].name)
        ):
            first[name] = task
    return list(first.values())


class ThreadStates:
    """What some threads are doing, sampled from /proc while a window runs: on a core
    (`running`), or waiting in a system call, by name (`futex`: a lock or a condition
    variable, such as the interpreter lock; `ioctl`: a driver call, such as a CUDA
    synchronize). Reading /proc/PID/task/TID/syscall needs the rights ptrace would (the same
    user, or root); sample few threads, since each read waits for its thread to be off-CPU
    or reports it running.

        with ThreadStates(first_threads(pid, "model-backend")) as states:
            ...                               # the window
        print(states.summary())
    """

    def __init__(self, tasks: list[Path], hz: float = 100.0) -> None:
        self.tasks, self.interval = tasks, 1.0 / hz
        self.counts: dict[str, int] = defaultdict(int)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ThreadStates:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for task in self.tasks:
                try:
                    call = (task / "syscall").read_text().split()[0]
                except (OSError, IndexError):
                    continue
                name = call if call == "running" else SYSCALLS.get(call, f"syscall {call}")
                self.counts[name] += 1

    def summary(self) -> str:
        total = sum(self.counts.values()) or 1
        parts = sorted(self.counts.items(), key=lambda kv: -kv[1])
        shares = ", ".join(f"{k} {v / total:.0%}" for k, v in parts[:5])
        return f"{len(self.tasks)} thread(s): {shares}"
