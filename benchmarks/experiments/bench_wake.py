"""What the server's wake-up on a request's arrival costs: loopback round trips, no HTTP.

    python benchmarks/experiments/bench_wake.py [--gap-ms 20] [--reps 300] [--payload 300]

A client process sends a small request (about the size of a 24-token query's HTTP request)
every `--gap-ms` on one TCP connection and reads a small reply; the server process answers
it. Variants: the server waits in `epoll_wait` with no timeout (what a parked tokio worker
does), or polls `epoll_wait` with a zero timeout in a loop (a thread that never sleeps);
the client likewise blocks on its reply or polls for it. Between the variants only the
waits differ, so each difference is a thread's wake-up on a core that went idle.

Prints p50 / p99 round-trip µs per variant, the variants alternating in rounds so a noisy
host spreads over all of them. Needs only a CPU.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import select
import socket
import statistics
import time

REPLY = b"r" * 120


def _serve(port_out: mp.Queue, poll: bool, payload: int) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port_out.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setblocking(False)
    ep = select.epoll()
    ep.register(conn.fileno(), select.EPOLLIN)
    pending = 0
    while True:
        while not ep.poll(0 if poll else -1):
            pass
        data = conn.recv(65536)
        if not data:
            return
        pending += len(data)
        while pending >= payload:
            pending -= payload
            conn.sendall(REPLY)


def _round_trips(
    port: int, poll_client: bool, gap_s: float, reps: int, payload: int
) -> list[float]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    ep = select.epoll()
    ep.register(sock.fileno(), select.EPOLLIN)
    request = b"q" * payload
    times = []
    for i in range(reps + 20):
        deadline = time.perf_counter() + gap_s
        while time.perf_counter() < deadline:
            time.sleep(max(0.0, deadline - time.perf_counter()))
        start = time.perf_counter()
        sock.sendall(request)
        got = 0
        while got < len(REPLY):
            while not ep.poll(0 if poll_client else -1):
                pass
            got += len(sock.recv(65536))
        if i >= 20:
            times.append((time.perf_counter() - start) * 1e6)
    sock.close()
    ep.close()
    return times


def _run(
    poll_server: bool, poll_client: bool, gap_s: float, reps: int, payload: int
) -> list[float]:
    ports: mp.Queue = mp.Queue()
    server = mp.Process(target=_serve, args=(ports, poll_server, payload), daemon=True)
    server.start()
    try:
        return _round_trips(ports.get(timeout=10), poll_client, gap_s, reps, payload)
    finally:
        server.join(timeout=5)
        if server.is_alive():
            server.kill()


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--gap-ms", type=float, default=20.0)
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--payload", type=int, default=300, help="request bytes")
    args = p.parse_args()
    variants = [
        ("server waits, client waits", False, False),
        ("server polls, client waits", True, False),
        ("server waits, client polls", False, True),
        ("server polls, client polls", True, True),
    ]
    results: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for _ in range(args.rounds):
        for name, poll_server, poll_client in variants:
            results[name] += _run(
                poll_server, poll_client, args.gap_ms / 1e3, args.reps, args.payload
            )
    print(f"\nloopback round trip, a request every {args.gap_ms} ms, p50 / p99 µs")
    print("| variant | p50 | p99 | mean |")
    print("|---|---|---|---|")
    for name, xs in results.items():
        p50, p99, mean = _pct(xs, 0.5), _pct(xs, 0.99), statistics.fmean(xs)
        print(f"| {name} | {p50:.1f} | {p99:.1f} | {mean:.1f} |")


if __name__ == "__main__":
    main()
