#!/usr/bin/env python3
"""Writes link/legate.profdata: the branch and call counts of `legate serve` serving traffic,
which optimised builds hand to LLVM (profile-guided optimisation; link/rustc-pgo).

It builds legate instrumented (`-Cprofile-generate`, added by link/rustc-pgo when
LEGATE_PGO_GENERATE is set, into target/pgo-generate) with the `release` cargo profile, runs it
in front of `legate mock` on loopback, sends every API's plain and streamed
requests (one by one, then several connections at once for a while), a few bad requests and the
admin endpoints, stops it, and merges what it wrote with the `llvm-profdata` of the compiler's own LLVM (the rustup
component `llvm-tools`). link/legate.profdata.llvm records that LLVM's major version: an older
LLVM cannot read the profile, and link/rustc-pgo builds without it there.

    rustup component add llvm-tools
    python3 link/pgo.py                 # then rebuild: cargo build --release
    python3 link/pgo.py --bin PATH      # instrumented builds already made (repeatable)

Make it again after larger changes to the request path or a compiler update (functions changed
since are optimised as without a profile), then link/order.py: the profile changes which
functions are inlined, so the symbol list must follow it. cargo does not see the profile change:
`touch build.rs` rebuilds legate itself, `cargo clean --release` everything.
"""

import argparse
import glob
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "legate.profdata")
# link/order.py's traffic: every API plain and streamed, bad requests, the admin endpoints.
_SPEC = importlib.util.spec_from_file_location("order", os.path.join(HERE, "order.py"))
ORDER = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ORDER)
PER_REQUEST = ORDER.PER_REQUEST
# Sequential rounds of every request kind, then requests per connection of the busy phase.
ROUNDS = 200
BUSY_CONNECTIONS = 8
BUSY_REQUESTS = 1500
# Symbol names carry a hash of the cargo profile they were built with, and the profile is
# looked up by name: the `release` profile's build is trained, the binary that ships and that
# the benchmark measures (bench/binary.rs). `cargo bench`'s own build of legate, with the
# tests' tokio features, runs at most the soak, and goes without.
BUILDS = [("release", ["build", "--release", "--locked", "--bin", "legate"])]


def rustc_info():
    text = subprocess.run(["rustc", "-vV"], check=True, capture_output=True, text=True).stdout
    host = re.search(r"^host: (\S+)", text, re.M).group(1)
    llvm = re.search(r"^LLVM version: (\d+)", text, re.M).group(1)
    return host, llvm


def profdata_tool(host):
    sysroot = subprocess.run(["rustc", "--print", "sysroot"], check=True, capture_output=True,
                             text=True).stdout.strip()
    tool = os.path.join(sysroot, "lib", "rustlib", host, "bin", "llvm-profdata")
    if not os.path.exists(tool):
        sys.exit("llvm-profdata of this compiler's LLVM is missing: rustup component add llvm-tools")
    return tool


def build(cargo_args, raw_dir):
    """An instrumented binary, built by link/rustc-pgo into a target directory of its own."""
    target = os.path.join(ROOT, "target", "pgo-generate")
    env = {**os.environ, "CARGO_TARGET_DIR": target, "LEGATE_PGO_GENERATE": raw_dir}
    env.pop("RUSTC_WRAPPER", None)
    subprocess.run(["cargo", *cargo_args], check=True, cwd=ROOT, env=env)
    return os.path.join(target, "release", "legate")


def busy(data, api, stream):
    send = PER_REQUEST.sender(data, api, stream)
    for _ in range(BUSY_REQUESTS if not stream else BUSY_REQUESTS // 5):
        send()
    send.close()


def train(binary, work, name):
    """Serves the traffic; the profile is written when `legate serve` exits."""
    # The mock is the same binary: its counts go to a file of its own, not merged.
    mock_env = {**ORDER.ENV, "LLVM_PROFILE_FILE": os.path.join(work, "mock-%p.ignored")}
    # Started and awaited as bench/per-request.py does: a bounded wait for its first line.
    mock, mock_url = PER_REQUEST.start([binary, "mock", "--listen", "127.0.0.1:0"],
                                       "legate mock listening on ", mock_env)
    serve = None
    try:
        mock_addr = ORDER.address(mock_url)
        conn = http.client.HTTPConnection(*mock_addr, timeout=ORDER.LIMIT)
        ORDER.send(conn, "PUT", "/_mock/script", json.dumps(PER_REQUEST.SCRIPT).encode(),
                   {"content-type": "application/json"})
        conn.close()
        config = os.path.join(work, "legate.toml")
        with open(config, "w") as f:
            f.write(PER_REQUEST.CONFIG.format(mock="http://%s:%d" % mock_addr))
        env = {**ORDER.ENV, "LLVM_PROFILE_FILE": os.path.join(work, f"{name}-%p.profraw")}
        serve, line = PER_REQUEST.start([binary, "serve", "--config", config],
                                        "legate listening on ", env)
        data, admin = ORDER.address(line), ORDER.address(line.split("admin", 1)[1])
        wrong = ORDER.drive(data, admin, rounds=ROUNDS)
        threads = [threading.Thread(target=busy, args=(data, api, stream))
                   for api in ("messages", "responses") for stream in (False, True)
                   for _ in range(BUSY_CONNECTIONS // 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ORDER.concurrent(data, 8)
        # SIGTERM: legate drains and exits, and the profile is written at exit.
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=ORDER.LIMIT)
    finally:
        # Nothing is left running if the traffic fails half-way.
        for proc in (serve, mock):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    if wrong:
        sys.exit(f"unexpected answers: {wrong[:5]}")
    raws = glob.glob(os.path.join(work, f"{name}-*.profraw"))
    if not raws:
        sys.exit("legate serve wrote no profile: is the binary instrumented?")
    return raws


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", action="append",
                        help="an instrumented legate already built (repeat for each profile)")
    parser.add_argument("--out", default=OUT, help="where to write the merged profile")
    args = parser.parse_args()
    host, llvm = rustc_info()
    tool = profdata_tool(host)
    raws = []
    with tempfile.TemporaryDirectory() as work:
        if args.bin:
            for i, binary in enumerate(args.bin):
                raws += train(os.path.abspath(binary), work, f"given{i}")
        else:
            for name, cargo_args in BUILDS:
                binary = build(cargo_args, os.path.join(work, "build"))
                raws += train(binary, work, name)
        # Sparse: only functions that ran, a tenth of the size.
        subprocess.run([tool, "merge", "--sparse", "-o", args.out, *raws], check=True)
    with open(args.out + ".llvm", "w") as f:
        f.write(llvm + "\n")
    print(f"{args.out}: {os.path.getsize(args.out):,} bytes, LLVM {llvm}")


if __name__ == "__main__":
    main()
