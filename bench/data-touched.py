#!/usr/bin/env python3
"""The data a request touches: distinct 64-byte lines of memory read or written per request,
by region (stack, heap, the binary's own data) and by the function whose access touched each
line first, traced with valgrind's lackey.

Instruction counts and the code footprint (footprint.py) say nothing about data. A request
whose data does not fit in the core's first-level data cache (32 KiB here) misses on most of it
at every request, and on a core it shares with other processes even more. callgrind's cache
simulation (`per-request.py --cache-sim`) counts the misses; this says what the lines are.

    cargo build --release
    python3 bench/data-touched.py [--bin target/release/legate] [--requests 230] [--last 30]

legate serves `--requests` sequential keep-alive `POST /v1/messages` requests (each written
with one send) under `valgrind --tool=lackey --trace-mem=yes`, in front of `legate mock`; the
trace is cut into requests at each entry of `Proxy::stamp` (once per answered request), and
the last `--last` of them (start-up and the first requests left out) are read. The trace is
about 1 MB per request plus 110 MB of start-up, written to a temporary directory. It needs
`valgrind` and `nm`, and takes about half a minute.
"""

import argparse
import bisect
import collections
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import http.client

_spec = importlib.util.spec_from_file_location(
    "per_request", os.path.join(os.path.dirname(os.path.abspath(__file__)), "per-request.py"))
pr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pr)

LINE = 64
MARKER = "legate::proxy::Proxy::stamp"


def symbols(binary):
    """(address, name) of the binary's functions, sorted, as linked (before relocation)."""
    out = subprocess.run(["nm", "-C", "--defined-only", "-n", binary],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            rows.append((int(parts[0], 16), parts[2]))
    return rows


def mapped(pid, binary):
    """Where the (position-independent) binary was loaded in the traced process, and the
    address ranges of its segments: valgrind maps the client's segments itself, and they show
    in its /proc maps."""
    name = os.path.realpath(binary)
    base, ranges = None, []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == name:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
                if int(fields[2], 16) == 0 and base is None:
                    base = start
    if base is None:
        sys.exit(f"{binary} is not mapped in process {pid}")
    return base, ranges


def trace(args, workdir):
    """Runs legate under lackey for `args.requests` requests; the trace's path, the binary's
    load base and its segments' ranges."""
    mock, mock_url = pr.start([args.bin, "mock", "--listen", "127.0.0.1:0"],
                              "legate mock listening on ", pr.ENV)
    try:
        conn = http.client.HTTPConnection(*pr.host_port(mock_url), timeout=10)
        conn.request("PUT", "/_mock/script", json.dumps(pr.SCRIPT).encode(),
                     {"content-type": "application/json"})
        assert conn.getresponse().status == 200
        config = os.path.join(workdir, "legate.toml")
        with open(config, "w") as f:
            f.write(pr.CONFIG.format(mock=mock_url))
        out = os.path.join(workdir, "trace.txt")
        cmd = ["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={out}",
               args.bin, "serve", "--config", config]
        proc, rest = pr.start(cmd, "legate listening on ", pr.ENV)
        base, ranges = mapped(proc.pid, args.bin)
        pr.ONE_SEND = True
        pr.drive(pr.host_port(rest), "messages", args.requests, False)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=pr.STARTUP_LIMIT)
        return out, base, ranges
    finally:
        mock.kill()
        mock.wait()


def windows(path, marker, keep_from):
    """The data accesses of each request from the `keep_from`th on: (line, instruction) pairs."""
    found, current, last_instr = 0, None, 0
    with open(path) as f:
        for line in f:
            if line.startswith("I"):
                last_instr = int(line[3:].split(",")[0], 16)
                if last_instr == marker:
                    found += 1
                    if current is not None:
                        yield current
                    current = [] if found >= keep_from else None
            elif current is not None and line[:2] in (" L", " S", " M"):
                address = int(line[3:].split(",")[0], 16)
                current.append((address // LINE, last_instr))
    # What follows the last marker is that request's end and the shutdown: not yielded.


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--bin", default="target/release/legate")
    parser.add_argument("--requests", type=int, default=230)
    parser.add_argument("--last", type=int, default=30)
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args()
    if not 1 <= args.last < args.requests:
        sys.exit("--last must be at least 1 and fewer than --requests (the first request, "
                 "start-up's, is never read)")
    syms = symbols(args.bin)
    marker = [a for a, name in syms if name == MARKER]
    if not marker:
        sys.exit(f"{MARKER} is not in {args.bin}'s symbols")
    with tempfile.TemporaryDirectory() as workdir:
        path, base, ranges = trace(args, workdir)
        starts = [a + base for a, _ in syms]
        text_end = base + (syms[-1][0] if syms else 0)

        def function(instr):
            i = bisect.bisect_right(starts, instr) - 1
            return syms[i][1] if 0 <= i and instr <= text_end else "(glibc, the vDSO)"

        def region(line):
            address = line * LINE
            if any(start <= address < end for start, end in ranges):
                return "the binary's own data (statics, tables)"
            # valgrind puts the client's thread stacks far above its heap. With legate's one
            # worker (its default, and this config's) the request's heap is the main thread's
            # brk heap; memory mapped for another thread's arena or a large block would be
            # counted as stack here.
            return "stack" if address >= 0x1000000000 else "heap"

        sizes, kept, by_region, by_function = [], [], collections.Counter(), {}
        previous = set()
        for accesses in windows(path, marker[0] + base, args.requests - args.last):
            first = {}
            for line, instr in accesses:
                first.setdefault(line, instr)
            sizes.append(len(first))
            kept.append(len(previous & first.keys()))
            previous = set(first)
            for line, instr in first.items():
                r = region(line)
                by_region[r] += 1
                by_function.setdefault(r, collections.Counter())[function(instr)] += 1
    n = len(sizes)
    if n == 0:
        sys.exit("no request found in the trace")
    middle = sorted(sizes)[n // 2]
    print(f"data lines touched per request (median of {n}): {middle:,} "
          f"({middle * LINE // 1024} KiB), of which the request before touched "
          f"{sorted(kept)[n // 2]:,}")
    for r, count in by_region.most_common():
        print(f"{count / n:10,.0f}  {r}, first touched by:")
        for name, c in by_function[r].most_common(args.rows):
            print(f"{c / n:18,.0f}  {name[:110]}")


if __name__ == "__main__":
    main()
