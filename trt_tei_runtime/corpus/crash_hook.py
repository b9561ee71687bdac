"""A test hook shared by the Ray actors and the local worker processes: the worker embedding
a given shard dies abruptly, once, as a killed or preempted worker would. It proves a lost
worker costs a retry, never a row; unset (always, outside tests) it does nothing."""

from __future__ import annotations

import os

# "SHARD:MARKER_PATH": the worker that has just embedded (part of) shard SHARD exits at once,
# once; the marker file records that it did, so the retry goes through.
CRASH_ENV = "TRT_TEI_EMBED_TEST_CRASH"


def maybe_crash(shard: int) -> None:
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    index, marker = spec.split(":", 1)
    if int(index) != shard:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # crashed once already: this is the retry
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    os._exit(1)
