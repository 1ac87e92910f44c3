#!/usr/bin/env python3
"""Bytes legate copies with memcpy per proxied request, and who copies them, counted by gdb.

Most of these copies are futures moved between the async functions of the request path: a
future of several KB built on the stack and then moved into a box, or passed up and down by
value. callgrind counts a large copy as a few instructions (`rep movsb`), so neither the
instruction count nor the allocation count shows them; gdb does. `legate mock` and `legate
serve` (one worker) run as in per-request.py; after a warm-up on one keep-alive connection,
gdb attaches, a breakpoint on libc's memcpy records each call's size and caller without
stopping, N more requests go through the same connection, and gdb detaches.

    python3 bench/copies.py [--bin target/release/legate] [--api messages|responses]
                            [--requests 20] [--lines]

`--lines` names each copy's source line (the innermost function inlined at the call, and its
file and line) instead of the function it was compiled into: it needs a build with line
tables, `RUSTFLAGS="-Cdebuginfo=line-tables-only -Cstrip=none"`.

Needs gdb (`apt-get install gdb`) and permission to attach (root, or ptrace_scope 0).
"""

import argparse
import http.client
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

_spec = importlib.util.spec_from_file_location(
    "per_request", os.path.join(os.path.dirname(os.path.abspath(__file__)), "per-request.py"))
per_request = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(per_request)

WARMUP = 50
# gdb prints this once its breakpoints are set and the process runs again.
ARMED = "COPIES ARMED"
ATTACH_LIMIT = 60

# libc picks one memmove/memcpy variant for the CPU at start-up (valgrind's virtual CPU sees
# another than the real one): every candidate gets the breakpoint, and only one ever fires.
GDB_SCRIPT = """
import gdb, collections
calls = collections.Counter()
copied = collections.Counter()
BY_LINE = @BY_LINE@

def site(frame):
    name = (frame.name() if frame else None) or "?"
    if BY_LINE and frame:
        sal = frame.find_sal()
        if sal.symtab:
            name = f"{sal.symtab.filename.split('/src/')[-1]}:{sal.line} {name}"
    return name

class Copy(gdb.Breakpoint):
    def stop(self):
        name = site(gdb.selected_frame().older())
        calls[name] += 1
        copied[name] += int(gdb.parse_and_eval("$rdx"))
        return False

# Each variant's memcpy is an alias of its memmove (one address): one breakpoint each.
for variant in ("evex", "avx512", "avx", "avx_rtm", "sse2"):
    try:
        Copy(f"__memmove_{variant}_unaligned_erms", internal=True)
    except gdb.error:
        pass

def report():
    for name, size in copied.most_common():
        print(f"COPY {calls[name]} {size} {name}")
"""

GDB_COMMANDS = """set pagination off
set confirm off
source {script}
python print("{armed}", flush=True)
continue
python report()
detach
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default="target/release/legate")
    parser.add_argument("--api", default="messages", choices=["messages", "responses"])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--lines", action="store_true",
                        help="name each copy's source line (needs a build with line tables)")
    args = parser.parse_args()
    env = {**per_request.ENV, "TOKIO_WORKER_THREADS": "1"}
    mock, mock_url = per_request.start([args.bin, "mock", "--listen", "127.0.0.1:0"],
                                       "legate mock listening on ", per_request.ENV)
    procs = [mock]
    try:
        conn = http.client.HTTPConnection(*per_request.host_port(mock_url), timeout=10)
        conn.request("PUT", "/_mock/script", json.dumps(per_request.SCRIPT).encode(),
                     {"content-type": "application/json"})
        assert conn.getresponse().status == 200
        with tempfile.TemporaryDirectory() as scratch:
            config = os.path.join(scratch, "legate.toml")
            with open(config, "w") as f:
                f.write(per_request.CONFIG.format(mock=mock_url))
            serve, rest = per_request.start([args.bin, "serve", "--config", config],
                                            "legate listening on ", env)
            procs.append(serve)
            send = per_request.sender(per_request.host_port(rest), args.api, False)
            for _ in range(WARMUP):
                send()
            script = os.path.join(scratch, "copies.py")
            commands = os.path.join(scratch, "copies.gdb")
            with open(script, "w") as f:
                f.write(GDB_SCRIPT.replace("@BY_LINE@", str(args.lines)))
            with open(commands, "w") as f:
                f.write(GDB_COMMANDS.format(script=script, armed=ARMED))
            gdb = subprocess.Popen(["gdb", "-p", str(serve.pid), "-batch", "-x", commands],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            procs.append(gdb)
            deadline = time.monotonic() + ATTACH_LIMIT
            while True:
                line = gdb.stdout.readline()
                if ARMED in line:
                    break
                if not line or time.monotonic() > deadline:
                    sys.exit("gdb did not attach (is gdb installed, and may it trace?)")
            for _ in range(args.requests):
                send()
            # Interrupting gdb stops `continue`; the script then reports and detaches.
            gdb.send_signal(signal.SIGINT)
            out, _ = gdb.communicate(timeout=ATTACH_LIMIT)
        rows = []
        for line in out.splitlines():
            if line.startswith("COPY "):
                _, n, size, name = line.split(" ", 3)
                rows.append((int(size), int(n), name))
        if not rows:
            sys.exit("gdb saw no memcpy: none of the breakpoint variants matched this libc")
        total = sum(r[0] for r in rows)
        count = sum(r[1] for r in rows)
        per = args.requests
        print(f"memcpy per request ({args.api}): {total / per:,.0f} bytes in {count / per:.1f} calls")
        for size, n, name in sorted(rows, reverse=True)[:40 if args.lines else 15]:
            print(f"  {size / per:8,.0f} B in {n / per:5.1f} calls  {name[:150]}")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
