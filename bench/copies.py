#!/usr/bin/env python3
"""Bytes legate copies with memcpy per proxied request, or its clock reads, and who makes them, counted by gdb.

Most of these copies are futures moved between the async functions of the request path: a
future of several KB built on the stack and then moved into a box, or passed up and down by
value. callgrind counts a large copy as a few instructions (`rep movsb`), so neither the
instruction count nor the allocation count shows them; gdb does. `legate mock` and `legate
serve` (one worker) run as in per-request.py; after a warm-up on one keep-alive connection,
gdb attaches, a breakpoint on libc's memcpy records each call's size and caller without
stopping, N more requests go through the same connection, and gdb detaches.

    python3 bench/copies.py [--bin target/release/legate] [--api messages|responses]
                            [--requests 20] [--lines] [--clock]

`--lines` names each copy's source line (the innermost function inlined at the call, and its
file and line) instead of the function it was compiled into: it needs a build with line
tables, `RUSTFLAGS="-Cdebuginfo=line-tables-only -Cstrip=none"`.

`--clock` counts clock reads instead (a breakpoint on glibc's `clock_gettime`: every
`Instant::now()` and `SystemTime::now()`, the standard library's and tokio's), each by the
first caller outside the clock's own wrappers and the two callers above it. callgrind counts a
read as a few dozen instructions; it takes far longer (bench/README.md, "Clock reads").

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
import gdb, collections, os, re
calls = collections.Counter()
copied = collections.Counter()
BY_LINE = @BY_LINE@
CLOCK = @CLOCK@

def site(frame):
    name = (frame.name() if frame else None) or "?"
    if BY_LINE and frame:
        sal = frame.find_sal()
        if sal.symtab:
            name = f"{sal.symtab.filename.split('/src/')[-1]}:{sal.line} {name}"
    return name

# The clock's own wrappers (the standard library's and tokio's `now`, `elapsed` and the like),
# passed over to reach the code that asked for the time.
WRAPPER = re.compile(r"(clock_gettime|Timespec|sys::pal::unix::time|sys::time::unix|"
                     r"Instant::now|Instant::elapsed|SystemTime::now)")
WRAPPER_NAMES = {"now", "elapsed", "duration_since", "saturating_duration_since"}
WRAPPER_FILES = {"clock.rs", "instant.rs", "time.rs", "source.rs", "batch.rs", "unix.rs"}

def plain(name):
    # Without generic arguments, nor the symbol hash of a build without line tables.
    out, depth = [], 0
    for ch in name:
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">" and depth > 0
    return re.sub(r"::h[0-9a-f]{16}$", "", "".join(out))

def asker(frame):
    names = []
    while frame is not None and len(names) < 3:
        name = plain(frame.name() or "?")
        sal = frame.find_sal()
        file = os.path.basename(sal.symtab.filename) if sal.symtab else ""
        last = name.rsplit("::", 1)[-1]
        wrapper = WRAPPER.search(name) or (last in WRAPPER_NAMES and file in WRAPPER_FILES)
        if names or not wrapper:
            names.append(f"{name} {file}:{sal.line}" if file else name)
        frame = frame.older()
    return " <- ".join(names)

class Read(gdb.Breakpoint):
    def stop(self):
        calls[asker(gdb.selected_frame().older())] += 1
        return False

class Copy(gdb.Breakpoint):
    def stop(self):
        name = site(gdb.selected_frame().older())
        calls[name] += 1
        copied[name] += int(gdb.parse_and_eval("$rdx"))
        return False

if CLOCK:
    # glibc's own symbol: the vDSO exports a `clock_gettime` too, which every read also runs.
    Read("__clock_gettime", internal=True)
else:
    # Which variant runs depends on the CPU: with ERMS (fast `rep movsb`) the `_erms` ones,
    # without it (this VM's CPU reports none) the plain ones. A variant's memcpy is its
    # memmove under a second name at one address: each address gets one breakpoint.
    armed = set()
    for variant in ("evex", "avx512", "avx", "sse2"):
        for kind in ("_erms", "", "_erms_rtm", "_rtm"):
            for call in ("memmove", "memcpy"):
                try:
                    bp = Copy(f"__{call}_{variant}_unaligned{kind}", internal=True)
                except gdb.error:
                    continue
                at = {loc.address for loc in bp.locations}
                if not at or at & armed:
                    bp.delete()
                armed |= at

def report():
    for name, n in calls.most_common():
        print(f"COPY {n} {copied[name]} {name}")
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
    parser.add_argument("--clock", action="store_true",
                        help="count clock reads, by who asked for the time, instead of copies")
    args = parser.parse_args()
    if args.requests < 1:
        sys.exit("--requests must be at least 1")
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
                f.write(GDB_SCRIPT.replace("@BY_LINE@", str(args.lines))
                        .replace("@CLOCK@", str(args.clock)))
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
        per = args.requests
        if args.clock:
            if not rows:
                sys.exit("gdb saw no clock read: glibc's __clock_gettime was not found")
            reads = sorted(((n, name) for _, n, name in rows), reverse=True)
            print(f"clock reads per request ({args.api}): {sum(n for n, _ in reads) / per:.1f}")
            for n, name in reads:
                print(f"  {n / per:5.2f}  {name[:200]}")
            return
        if not rows:
            sys.exit("gdb saw no memcpy: none of the breakpoint variants matched this libc")
        total = sum(r[0] for r in rows)
        count = sum(r[1] for r in rows)
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
