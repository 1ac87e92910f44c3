#!/usr/bin/env python3
"""Two legate builds side by side in the full benchmark: alternating runs, summed up per build.

One full run (`cargo bench --bench proxy`) moves with the host by more than a change of a few
percent of instructions moves legate; runs of two builds made in different hours compare the
hours, not the builds. This runs the benchmark executable again and again, naming build A and
build B in turn as the binary to measure (`BENCH_LEGATE_BIN`), and prints, per row, the median
and range over each build's runs of the run's own figure (its median of three samples), and how
often B read above A against the run of A just before it.

    cargo bench --bench proxy --no-run          # prints the executable's path
    python3 bench/ab.py --bench target/release/deps/proxy-HASH --a OLD_LEGATE --b NEW_LEGATE \\
                        [--pairs 5] [--logs DIR]
    python3 bench/ab.py --parse a:RUN1.log b:RUN2.log a:RUN3.log ...   # runs already made

Each run is one full benchmark (about two minutes on a 2-core machine); keep the machine
otherwise idle.
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile

# One full run takes about two minutes; one that is still going after this is stuck.
RUN_LIMIT_S = 1800

# The most runs of each build one call makes (each is a full benchmark).
PAIRS_MAX = 50

# The table rows compared, and the column of legate's figure in each (0 = the metric's name):
# the ratio to nginx where the row has one, legate's own value where it does not.
ROWS = [
    ("proxy CPU per request /v1/messages @", 4, "CPU per /v1/messages request @1k req/s, × nginx"),
    ("proxy CPU per request /v1/responses @", 4, "CPU per /v1/responses request @1k req/s, × nginx"),
    ("CPU per request at max load", 4, "CPU per request at max load, × nginx"),
    ("of which user time", 4, "user time at max load, × nginx's"),
    ("throughput, 32 connections", 4, "throughput, × the mock"),
    ("throughput, 32 connections", 5, "nginx's throughput in the same runs, × the mock"),
    ("latency p99 /v1/messages @", 4, "added p99 /v1/messages @1k req/s, ms"),
    ("latency p99 /v1/responses @", 4, "added p99 /v1/responses @1k req/s, ms"),
    ("legate RSS 3 s after the load", 2, "legate RSS 3 s after the load, MiB"),
]

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def figures(text):
    """The compared figures of one run's output, by row label (missing rows left out)."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    out = {}
    for prefix, column, label in ROWS:
        for line in lines:
            if line.startswith("| " + prefix):
                cells = [c.strip() for c in line.split("|")[1:-1]]
                m = _NUMBER.search(cells[column]) if column < len(cells) else None
                if m:
                    out[label] = float(m.group(0))
                break
    return out


def summary(runs):
    """`runs` is [(build, figures)] in the order they ran; prints the comparison table."""
    builds = {"a": [f for b, f in runs if b == "a"], "b": [f for b, f in runs if b == "b"]}
    print(f"| row | A ({len(builds['a'])} runs) | B ({len(builds['b'])} runs) | B above the A before it |")
    print("|---|---:|---:|---:|")
    for _, _, label in ROWS:
        cells = []
        for b in ("a", "b"):
            values = [f[label] for f in builds[b] if label in f]
            if values:
                cells.append(f"{statistics.median(values):#.3g} ({min(values):#.3g}–{max(values):#.3g})")
            else:
                cells.append("–")
        above, pairs, last_a = 0, 0, None
        for b, f in runs:
            if b == "a":
                last_a = f.get(label)
            elif last_a is not None and label in f:
                pairs += 1
                above += f[label] > last_a
        print(f"| {label} | {cells[0]} | {cells[1]} | {above} of {pairs} |")


def bench_once(bench, binary):
    """One full run of `binary`: (exit status, stdout, stderr). The run gets a process group of
    its own, so that one past RUN_LIMIT_S is stopped with the legate, mock and nginx it
    started."""
    env = dict(os.environ, BENCH_LEGATE_BIN=os.path.abspath(binary))
    child = subprocess.Popen([bench, "--bench"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True, env=env)
    try:
        out, err = child.communicate(timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        err += f"\nab.py: stopped after {RUN_LIMIT_S} s\n"
    return child.returncode, out, err


def run(args):
    logs = args.logs or tempfile.mkdtemp(prefix="legate-ab-")
    os.makedirs(logs, exist_ok=True)
    runs = []
    for i in range(args.pairs):
        for build, binary in (("a", args.a), ("b", args.b)):
            code, out, err = bench_once(args.bench, binary)
            path = os.path.join(logs, f"{i + 1:02d}-{build}.log")
            with open(path, "w") as f:
                f.write(out + err)
            if code != 0:
                print(f"ab.py: run {i + 1} of {build.upper()} exited {code} ({path})",
                      file=sys.stderr)
            runs.append((build, figures(out)))
            print(f"run {i + 1} {build.upper()}: {path}", file=sys.stderr)
    summary(runs)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", help="the benchmark executable (cargo bench --no-run prints it)")
    p.add_argument("--a", help="build A: a legate binary")
    p.add_argument("--b", help="build B: a legate binary")
    p.add_argument("--pairs", type=int, default=5, help="runs of each build, alternating")
    p.add_argument("--logs", help="directory for each run's output (default: a new temporary one)")
    p.add_argument("--parse", nargs="+", metavar="a|b:LOG",
                   help="summarise runs already made, in the order given")
    args = p.parse_args()
    if args.parse:
        runs = []
        for item in args.parse:
            build, _, path = item.partition(":")
            if build not in ("a", "b") or not path:
                sys.exit(f"ab.py: --parse takes a:LOG or b:LOG, not {item}")
            with open(path) as f:
                runs.append((build, figures(f.read())))
        summary(runs)
        return
    if not (args.bench and args.a and args.b):
        p.error("--bench, --a and --b are needed (or --parse)")
    if not 1 <= args.pairs <= PAIRS_MAX:
        p.error(f"--pairs is 1 to {PAIRS_MAX}")
    for binary in (args.a, args.b):
        if not os.access(binary, os.X_OK):
            p.error(f"{binary} is not an executable")
    run(args)


if __name__ == "__main__":
    main()
