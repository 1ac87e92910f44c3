#!/usr/bin/env python3
"""System calls and context switches a proxy spends per proxied request, legate next to nginx.

`legate mock` is the upstream; `legate serve` (and, when installed, nginx with the benchmark's
configuration) sits in front of it on loopback. After a warm-up, `perf stat` counts the system
calls of the proxy (all its threads; for nginx the master and its workers) while N sequential
requests go through it, taking turns on K keep-alive connections (one by default), each request
written with one `send`; the counts divided by N are the cost of one request.
Context switches, CPU time and minor page faults are read from /proc (all threads) before and
after a separate pass of N requests, without perf attached.

    python3 bench/syscalls.py [--bin target/release/legate] [--api messages|responses]
                              [--requests 2000] [--connections 1] [--stream] [--no-nginx]
                              [--env KEY=VALUE ...]

Needs `perf` (linux-perf) with permission to trace the processes (root, or
kernel.perf_event_paranoid <= 1 and tracefs access); nginx is optional.
"""

import argparse
import collections
import glob
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

# The mock's script, legate's config and the start-up helpers are per-request.py's.
_spec = importlib.util.spec_from_file_location(
    "per_request", os.path.join(os.path.dirname(os.path.abspath(__file__)), "per-request.py"))
per_request = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(per_request)

WARMUP = 200
FAILED = "(of which failed)"
# perf needs a moment to attach to every thread before the counted requests start.
PERF_SETTLE = 1.0


def tasks(pids):
    """Every thread of every process in `pids`."""
    return [t for p in pids for t in glob.glob(f"/proc/{p}/task/*")]


def switches(pids):
    """Voluntary and involuntary context switches, and nanoseconds on a CPU, of all threads."""
    total = [0, 0, 0, 0, 0, 0]
    for p in pids:
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # minflt, utime, stime (clock ticks) of the whole process, all threads.
        total[3] += int(fields[7])
        total[4] += int(fields[11])
        total[5] += int(fields[12])
    for t in tasks(pids):
        try:
            text = open(f"{t}/status").read()
            oncpu = int(open(f"{t}/schedstat").read().split()[0])
        except OSError:
            continue
        total[0] += int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", text, re.M).group(1))
        total[1] += int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", text, re.M).group(1))
        total[2] += oncpu
    return total


def children(pid):
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.split("/")[2]))
    return out


def parse_counts(text):
    """`perf stat` counts: {syscall: calls}, and "failed": calls that returned an error."""
    counts = collections.Counter()
    for line in text.splitlines():
        m = re.match(r"^\s+([\d,]+)\s+syscalls:sys_enter_([a-z_0-9]+)", line)
        if m:
            counts[m.group(2)] += int(m.group(1).replace(",", ""))
        m = re.match(r"^\s+([\d,]+)\s+raw_syscalls:sys_exit", line)
        if m:
            counts[FAILED] += int(m.group(1).replace(",", ""))
    return counts


class Driver:
    """Sequential requests, each written with one `send` (as a load generator writes prepared
    bytes), turn by turn over `connections` keep-alive connections opened beforehand."""

    def __init__(self, addr, api, connections, stream=False):
        path, body, headers = {
            "messages": ("/v1/messages", per_request.MESSAGE,
                         {"anthropic-version": "2023-06-01", "x-api-key": "bench-caller-key"}),
            "responses": ("/v1/responses", per_request.RESPONSE,
                          {"authorization": "Bearer bench-caller-key"}),
        }[api]
        payload = per_request.json.dumps({**body, "stream": True} if stream else body).encode()
        head = f"POST {path} HTTP/1.1\r\nhost: {addr[0]}:{addr[1]}\r\n"
        head += "content-type: application/json\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head += f"content-length: {len(payload)}\r\n\r\n"
        self.request = head.encode() + payload
        self.socks = [socket.create_connection(addr, timeout=60) for _ in range(connections)]
        for s in self.socks:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.turn = 0

    def one(self):
        s = self.socks[self.turn % len(self.socks)]
        self.turn += 1
        s.sendall(self.request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                sys.exit("connection closed mid-response")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            sys.exit(f"status: {head.splitlines()[0]!r}")
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        if length is None:
            # Chunked (a stream): read up to the last chunk.
            while not rest.endswith(b"\r\n0\r\n\r\n") and rest != b"0\r\n\r\n":
                rest += s.recv(65536)
            return
        while len(rest) < int(length.group(1)):
            rest += s.recv(65536)

    def run(self, n):
        for _ in range(n):
            self.one()

    def close(self):
        for s in self.socks:
            s.close()


def measure(pids, addr, args):
    api, n = args.api, args.requests
    drive = Driver(addr, api, args.connections, args.stream)
    drive.run(WARMUP)
    before = switches(pids)
    drive.run(n)
    after = switches(pids)
    ctx = [(a - b) / n for a, b in zip(after, before)]
    with tempfile.NamedTemporaryFile("r", suffix=".perf") as out:
        # Counted in the kernel (no event is lost, unlike `perf trace` under load); the exits
        # are filtered to those that failed (EAGAIN and the like).
        perf = subprocess.Popen(
            ["perf", "stat", "-e", "syscalls:sys_enter_*", "-e", "raw_syscalls:sys_exit",
             "--filter", "ret < 0", "-o", out.name, "-p", ",".join(map(str, pids))],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(PERF_SETTLE)
        drive.run(n)
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=30)
        counts = parse_counts(open(out.name).read())
    drive.close()
    return {k: c / n for k, c in counts.items()}, ctx


def start_nginx(workdir, mock_url):
    root = os.path.join(workdir, "nginx")
    os.makedirs(root, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = s.getsockname()
    conf = os.path.join(root, "nginx.conf")
    with open(conf, "w") as f:
        f.write(per_request.NGINX_CONFIG.format(master="on", workers=2, r=root,
                                                addr=f"{addr[0]}:{addr[1]}",
                                                mock=mock_url.removeprefix("http://")))
    proc = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-p", root, "-c", conf,
                             "-e", os.path.join(root, "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(addr, timeout=1).close()
            break
        except OSError:
            time.sleep(0.01)
    while len(children(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc, addr


def table(results, args):
    names = sorted({k for r, _ in results.values() for k in r if k != FAILED},
                   key=lambda k: -max(r.get(k, 0) for r, _ in results.values()))
    cols = list(results)
    print(f"per request: {args.requests} sequential {'streaming ' if args.stream else ''}"
          f"{args.api} requests over {args.connections} keep-alive connection(s)")
    print("| syscall | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for k in names:
        if any(results[c][0].get(k, 0) >= 0.005 for c in cols):
            cells = [f"{results[c][0][k]:.2f}" if results[c][0].get(k) else "–" for c in cols]
            print(f"| {k} | " + " | ".join(cells) + " |")
    print("| **total** | " + " | ".join(
        f"**{sum(v for k, v in results[c][0].items() if k != FAILED):.2f}**" for c in cols) + " |")
    print(f"| {FAILED} | " + " | ".join(
        f"{results[c][0].get(FAILED, 0):.2f}" for c in cols) + " |")
    print("| context switches (voluntary + involuntary) | " + " | ".join(
        f"{results[c][1][0]:.2f} + {results[c][1][1]:.2f}" for c in cols) + " |")
    print("| CPU time (µs, user + system, without perf attached) | " + " | ".join(
        f"{results[c][1][2] / 1000:.0f}" for c in cols) + " |")
    tick = 1e6 / os.sysconf("SC_CLK_TCK")
    print("| of which user / system (µs, in clock ticks) | " + " | ".join(
        f"{results[c][1][4] * tick:.0f} / {results[c][1][5] * tick:.0f}" for c in cols) + " |")
    print("| minor page faults | " + " | ".join(
        f"{results[c][1][3]:.2f}" for c in cols) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default="target/release/legate")
    parser.add_argument("--api", default="messages", choices=["messages", "responses"])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--connections", type=int, default=1,
                        help="keep-alive connections the sequential requests take turns on")
    parser.add_argument("--stream", action="store_true",
                        help='"stream": true requests (the mock sends its events at once)')
    parser.add_argument("--no-nginx", action="store_true")
    parser.add_argument("--env", action="append", default=[],
                        help="KEY=VALUE for legate serve (e.g. TOKIO_WORKER_THREADS=2)")
    args = parser.parse_args()
    env = {**per_request.ENV, **dict(e.split("=", 1) for e in args.env)}
    mock, mock_url = per_request.start([args.bin, "mock", "--listen", "127.0.0.1:0"],
                                       "legate mock listening on ", per_request.ENV)
    procs = [mock]
    results = {}
    try:
        conn = per_request.http.client.HTTPConnection(*per_request.host_port(mock_url), timeout=10)
        conn.request("PUT", "/_mock/script", per_request.json.dumps(per_request.SCRIPT).encode(),
                     {"content-type": "application/json"})
        assert conn.getresponse().status == 200
        with tempfile.TemporaryDirectory() as workdir:
            config = os.path.join(workdir, "legate.toml")
            with open(config, "w") as f:
                f.write(per_request.CONFIG.format(mock=mock_url))
            legate, rest = per_request.start([args.bin, "serve", "--config", config],
                                             "legate listening on ", env)
            procs.append(legate)
            results["legate"] = measure([legate.pid], per_request.host_port(rest), args)
            legate.send_signal(signal.SIGTERM)
            if not args.no_nginx and (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")):
                nginx, addr = start_nginx(workdir, mock_url)
                procs.append(nginx)
                pids = [nginx.pid, *children(nginx.pid)]
                results["nginx"] = measure(pids, addr, args)
                nginx.send_signal(signal.SIGQUIT)
                nginx.wait(timeout=10)
            results["mock (direct)"] = measure([mock.pid], per_request.host_port(mock_url), args)
        table(results, args)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
