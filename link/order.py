#!/usr/bin/env python3
"""Writes link/symbol-order.txt: the functions of the release `legate` binary that start-up and
serving run, hottest first, for lld to place side by side (build.rs passes the file to it).

A fault on the binary's code maps the 64 KiB around it, so code that runs, scattered among code
that never does, keeps most of the executable resident. Packed together at the start of the
code, the functions that start-up and serving run take a fraction of the pages.

It runs `legate serve` under callgrind (`valgrind`, without demangling) in front of
`legate mock` on loopback, sends every API's plain and streamed requests (one by one and a few
at once), the admin endpoints and a few bad requests, then lists the functions of the binary
that ran, by instructions spent in each. The functions that a start-up on the embedded default
config (no file, the quick start's) runs beyond those follow them.

Symbol names carry hashes of the build's profile, compiler and dependency versions, so the list
is made from the `release` profile's build (the binary that ships and that the benchmark
measures), and made again after a compiler or dependency update (a name lld does not find is
skipped: a stale list costs memory, not a build):

    cargo build --release && python3 link/order.py

`--add` keeps the names already listed and adds another build's after them.
"""

import argparse
import collections
import http.client
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading

ENV = {"ANTHROPIC_API_KEY": "order-anthropic-key", "OPENAI_API_KEY": "order-openai-key",
       "LEGATE_LOG": "warn"}
PROMPT = [{"role": "user", "content": "Say hello in one short sentence."}]
ANTHROPIC = {"anthropic-version": "2023-06-01", "x-api-key": "caller-key",
             "content-type": "application/json"}
OPENAI = {"authorization": "Bearer caller-key", "content-type": "application/json"}
REQUESTS = [
    ("/v1/messages", ANTHROPIC,
     {"model": "claude-sonnet-4-5", "max_tokens": 256, "messages": PROMPT}),
    ("/v1/chat/completions", OPENAI, {"model": "gpt-4.1-mini", "messages": PROMPT}),
    ("/v1/responses", OPENAI, {"model": "gpt-4.1-mini", "input": PROMPT}),
]
# The same launcher and bounded waits as bench/per-request.py (its name is not importable).
_SPEC = importlib.util.spec_from_file_location(
    "per_request", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench",
                                "per-request.py"))
PER_REQUEST = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(PER_REQUEST)
LIMIT = PER_REQUEST.STARTUP_LIMIT


def start(cmd, prefix, env=None):
    """Starts `cmd` and returns it with the rest of its first line that starts with `prefix`
    (bench/per-request.py's launcher, which waits a bounded time)."""
    return PER_REQUEST.start(cmd, prefix, ENV if env is None else env)


def default_start(binary, work):
    """The functions a start-up on the embedded default config runs, as the quick start's
    `legate serve` without a file does: its configuration (the default prices, durations and
    sections, keys from the environment) and its log lines at the default level take code the
    traffic run's minimal file at `warn` never runs. Left out, those functions lay scattered
    through the code, and each fault on one maps the 64 KiB around it: about 1.2 MiB more of
    the binary resident after such a start."""
    profile = os.path.join(work, "callgrind-default.out")
    env = {k: v for k, v in ENV.items() if k != "LEGATE_LOG"}
    env.update({"LEGATE__SERVER__LISTEN": "127.0.0.1:0",
                "LEGATE__SERVER__ADMIN_LISTEN": "127.0.0.1:0"})
    cmd = ["valgrind", "--tool=callgrind", "--demangle=no",
           f"--callgrind-out-file={profile}", binary, "serve"]
    serve, line = start(cmd, "legate listening on ", env)
    admin = http.client.HTTPConnection(*address(line.split("admin", 1)[1]), timeout=LIMIT)
    send(admin, "GET", "/readyz")
    admin.close()
    serve.send_signal(signal.SIGTERM)
    serve.wait(timeout=LIMIT)
    return profile


def address(text):
    host, port = re.search(r"127\.0\.0\.1:\d+", text).group(0).split(":")
    return host, int(port)


def send(conn, method, path, body=None, headers=None):
    payload = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    conn.request(method, path, payload, headers or {})
    reply = conn.getresponse()
    reply.read()
    return reply.status


def drive(data, admin, rounds):
    """Every API plain and streamed, one connection at a time; returns unexpected statuses."""
    wrong = []
    conn = http.client.HTTPConnection(*data, timeout=LIMIT)
    for _ in range(rounds):
        for path, headers, body in REQUESTS:
            for stream in (False, True):
                status = send(conn, "POST", path, {**body, "stream": stream}, headers)
                if status != 200:
                    wrong.append((path, stream, status))
    # Bad requests answered with errors: unknown route, malformed JSON, missing model.
    for path, body in (("/v1/nope", b"{}"), ("/v1/messages", b"{not json"),
                       ("/v1/messages", b'{"max_tokens": 1}')):
        send(conn, "POST", path, body, ANTHROPIC)
    conn.close()
    a = http.client.HTTPConnection(*admin, timeout=LIMIT)
    for path in ("/metrics", "/readyz", "/healthz", "/admin/usage", "/admin/requests"):
        send(a, "GET", path)
    a.close()
    return wrong


def concurrent(data, n):
    """`n` connections at once, so the upstream pool opens and reuses several."""
    threads = [threading.Thread(target=drive_plain, args=(data,)) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def drive_plain(data):
    conn = http.client.HTTPConnection(*data, timeout=LIMIT)
    for path, headers, body in REQUESTS:
        send(conn, "POST", path, body, headers)
    conn.close()


def functions(profile, binary):
    """The binary's functions in a callgrind profile, by instructions spent in each (self)."""
    names, objects, owner, cost = {}, {}, {}, collections.Counter()
    current, current_ob, skip = None, None, False
    with open(profile, errors="replace") as f:
        for line in f:
            m = re.match(r"(c?)(ob|fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
            if m:
                callee, kind, ident, name = m.groups()
                table = objects if kind == "ob" else names
                if name:
                    table[ident] = name
                if not callee and kind == "ob":
                    current_ob = objects.get(ident)
                elif not callee:
                    current = ident
                    owner[ident] = current_ob
                continue
            if line.startswith("calls="):
                skip = True  # the next cost line is the call's inclusive cost
                continue
            if line[:1].isdigit() or line[:1] in "+-*":
                if skip:
                    skip = False
                    continue
                parts = line.split()
                if current and len(parts) >= 2:
                    cost[current] += int(parts[1])
    order, seen = [], set()
    for ident, _ in cost.most_common():
        if not (owner.get(ident) or "").endswith(binary):
            continue
        # callgrind marks recursion levels ('2) and LTO marks promoted locals (.1234): the
        # linker knows the name without the first, and with the second.
        name = re.sub(r"'\d+$", "", names[ident])
        if name not in seen:
            seen.add(name)
            order.append(name)
    return order


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default="target/release/legate")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "symbol-order.txt"))
    parser.add_argument("--add", action="store_true",
                        help="keep the names already in --out and add this binary's after them "
                             "(for a build of another cargo profile)")
    args = parser.parse_args()
    binary = os.path.abspath(args.bin)
    with tempfile.TemporaryDirectory() as work:
        mock, mock_line = start([binary, "mock", "--listen", "127.0.0.1:0"], "legate mock")
        try:
            config = os.path.join(work, "legate.toml")
            with open(config, "w") as f:
                f.write(PER_REQUEST.CONFIG.format(mock="http://%s:%d" % address(mock_line)))
            profile = os.path.join(work, "callgrind.out")
            cmd = ["valgrind", "--tool=callgrind", "--demangle=no",
                   f"--callgrind-out-file={profile}", binary, "serve", "--config", config]
            serve, line = start(cmd, "legate listening on ")
            data, admin = address(line), address(line.split("admin", 1)[1])
            wrong = drive(data, admin, rounds=20)
            concurrent(data, 8)
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=LIMIT)
        finally:
            mock.kill()
        if wrong:
            sys.exit(f"unexpected answers: {wrong[:5]}")
        order = functions(profile, os.path.basename(binary))
        # Then what a start-up on the default config adds, after them: it runs once.
        listed = set(order)
        default = functions(default_start(binary, work), os.path.basename(binary))
        order += [name for name in default if name not in listed]
    if args.add and os.path.exists(args.out):
        # Another profile's build: its names go after the ones already listed.
        kept = [line.strip() for line in open(args.out) if line.strip()]
        known = set(kept)
        order = kept + [name for name in order if name not in known]
    with open(args.out, "w") as f:
        f.write("\n".join(order) + "\n")
    print(f"{len(order)} names in {args.out}")


if __name__ == "__main__":
    main()
