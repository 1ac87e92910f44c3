#!/usr/bin/env python3
"""Instructions and heap allocations legate spends per proxied request, counted by valgrind.

Deterministic where wall-clock numbers are not (a shared machine moves them): legate serve runs
under valgrind (callgrind for instructions, DHAT for allocations) in front of `legate mock`, and
serves two counts of sequential keep-alive requests; the difference of the totals divided by the
difference of the counts is the cost of one request, start-up and shutdown cancelling out.

    python3 bench/per-request.py [--bin target/release/legate] [--api messages|responses]
                                 [--few 200] [--many 1200] [--tool callgrind|dhat|both]
                                 [--stream [--blocks N]] [--nginx] [--floor [BIN]]
                                 [--by-file ROWS] [--atomics] [--cache-sim] [--sdk-headers]
                                 [--one-send]

`--stream` asks for `"stream": true` answers (the mock's event stream, read to its end), to
count what a streamed request costs instead of a whole answer; `--blocks N` makes every answer N
text blocks instead of one (the mock streams each as its start, three deltas and its end), so
that two runs tell what one more event costs in a long stream. callgrind also reports the code a
request runs through (see footprint.py). `--nginx` counts nginx the same way (the benchmark's
proxy configuration, one worker, no master process) in front of the same mock, when installed;
`--floor` counts examples/hyper_floor.rs, a bare hyper-to-hyper proxy with nothing of legate's
own (build it first: `cargo build --release --example hyper_floor`). `--by-file ROWS` lists
where the instructions come from by source file and crate (see byfile.py; it needs a build with
line tables). `--atomics` counts the locked read-modify-write instructions a request runs, by
where they come from (see atomics.py; the same build). `--cache-sim` has callgrind simulate
the caches too and prints the first-level misses per request, of a process with the machine to
itself (what other processes' work evicts between requests is not in it). `--sdk-headers` sends the headers an official SDK sends (the Anthropic Python
SDK's set, wire-protocol §C3: `user-agent`, `accept`, and nine `X-Stainless-*` telemetry
lines) instead of the few the benchmark's load generator sends.
"""

import argparse
import http.client
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

# Loaded by path: link/order.py, syscalls.py and copies.py load this file from elsewhere.
_spec = importlib.util.spec_from_file_location(
    "footprint", os.path.join(os.path.dirname(os.path.abspath(__file__)), "footprint.py"))
footprint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(footprint)
_spec = importlib.util.spec_from_file_location(
    "byfile", os.path.join(os.path.dirname(os.path.abspath(__file__)), "byfile.py"))
byfile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(byfile)
_spec = importlib.util.spec_from_file_location(
    "atomics", os.path.join(os.path.dirname(os.path.abspath(__file__)), "atomics.py"))
atomics = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(atomics)

MESSAGE = {"model": "claude-sonnet-4-5", "max_tokens": 256,
           "messages": [{"role": "user", "content": "Say hello in one short sentence."}]}
RESPONSE = {"model": "gpt-4.1-mini", "max_output_tokens": 256,
            "input": [{"role": "user", "content": "Say hello in one short sentence."}]}
SCRIPT = {"default": {"content": [{"type": "text", "text": (
    "Hello! legate is a model ambassador: a small proxy that sits beside an agent on localhost "
    "and owns the connection to the model providers, with their keys, timeouts, streaming, "
    "usage metering and metrics. This reply is padded to a few hundred bytes so that the "
    "benchmark carries a body about the size of a short real answer.")}]}}
CONFIG = """[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[providers.anthropic]
kind = "anthropic"
base_url = "{mock}"
api_key_env = "ANTHROPIC_API_KEY"
max_concurrency = 4096

[providers.openai]
kind = "openai"
base_url = "{mock}"
api_key_env = "OPENAI_API_KEY"
max_concurrency = 4096
"""
ENV = {"ANTHROPIC_API_KEY": "bench-anthropic-key", "OPENAI_API_KEY": "bench-openai-key",
       "LEGATE_LOG": "warn"}
# Bounded waits: start-up under valgrind is slow, but not this slow.
STARTUP_LIMIT = 120


def start(cmd, prefix, env):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**os.environ, **env}, text=True)
    deadline = time.monotonic() + STARTUP_LIMIT
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(prefix):
            return proc, line[len(prefix):].strip()
    proc.kill()
    sys.exit(f"{cmd[0]}: no line starting {prefix!r}")


def host_port(url):
    host, port = url.removeprefix("http://").split(" ")[0].split(":")
    return host, int(port)


# The Anthropic Python SDK's own request headers (wire-protocol §C3), in its spelling.
SDK_HEADERS = {"Accept": "application/json", "User-Agent": "Anthropic/Python 2.14.0",
               "X-Stainless-Lang": "python", "X-Stainless-Package-Version": "2.14.0",
               "X-Stainless-OS": "Linux", "X-Stainless-Arch": "x64",
               "X-Stainless-Runtime": "CPython", "X-Stainless-Runtime-Version": "3.12.3",
               "X-Stainless-Async": "false", "x-stainless-retry-count": "0",
               "x-stainless-read-timeout": "600"}
# Set by --sdk-headers.
WITH_SDK_HEADERS = False
ONE_SEND = False
# `--cache-sim`: callgrind also simulates the caches (its I1/D1/LL model of this machine).
CACHE_SIM = []


class OneSend(http.client.HTTPConnection):
    """Writes a request's head and body in one `send`. http.client writes them in two, and
    whether the body is already there when legate reads the head then depends on timing: when
    it is not, legate takes its piped-body path, which costs about 700 more instructions and an
    allocation, so the totals move by that much from run to run. SDKs write them in two too, so
    the default counts both paths as they come; this gives one path, for comparing builds."""

    def _send_output(self, message_body=None, encode_chunked=False):
        self._buffer.extend((b"", b""))
        head = b"\r\n".join(self._buffer)
        del self._buffer[:]
        self.send(head + (message_body or b""))


def sender(addr, api, stream):
    """A function that sends one request over one keep-alive connection and reads the answer."""
    path, body, headers = {
        "messages": ("/v1/messages", MESSAGE,
                     {"anthropic-version": "2023-06-01", "x-api-key": "bench-caller-key"}),
        "responses": ("/v1/responses", RESPONSE, {"authorization": "Bearer bench-caller-key"}),
    }[api]
    payload = json.dumps({**body, "stream": True} if stream else body).encode()
    headers = {**headers, "content-type": "application/json"}
    if WITH_SDK_HEADERS:
        headers = {**SDK_HEADERS, **headers}
    conn = (OneSend if ONE_SEND else http.client.HTTPConnection)(*addr, timeout=60)

    def send():
        conn.request("POST", path, payload, headers)
        reply = conn.getresponse()
        reply.read()
        if reply.status != 200:
            sys.exit(f"{path}: status {reply.status}")
    send.close = conn.close
    return send


def drive(addr, api, count, stream):
    send = sender(addr, api, stream)
    for _ in range(count):
        send()
    send.close()


def one(args, tool, count, mock_url, workdir):
    out = os.path.join(workdir, f"{tool}.{count}.out")
    config = os.path.join(workdir, "legate.toml")
    with open(config, "w") as f:
        f.write(CONFIG.format(mock=mock_url))
    opts = {"callgrind": [f"--callgrind-out-file={out}", "--dump-instr=yes", *CACHE_SIM],
            "dhat": [f"--dhat-out-file={out}"]}[tool]
    cmd = ["valgrind", f"--tool={tool}", *opts, args.bin, "serve", "--config", config]
    proc, rest = start(cmd, "legate listening on ", ENV)
    drive(host_port(rest), args.api, count, args.stream)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=STARTUP_LIMIT)
    text = open(out).read()
    if tool == "callgrind":
        return int(re.search(r"^summary: (\d+)", text, re.M).group(1))
    dhat = json.loads(text)
    return sum(pp["tb"] for pp in dhat["pps"]), sum(pp["tbk"] for pp in dhat["pps"])


# bench/nginx.rs's proxy configuration; syscalls.py runs it as the benchmark does (a master
# and two workers), `--nginx` here as one process, so that valgrind sees all of it.
NGINX_CONFIG = """daemon off;
master_process {master};
worker_processes {workers};
pid {r}/nginx.pid;
error_log {r}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {r}/client_body;
    proxy_temp_path {r}/proxy;
    fastcgi_temp_path {r}/fastcgi;
    uwsgi_temp_path {r}/uwsgi;
    scgi_temp_path {r}/scgi;
    upstream mock {{
        server {mock};
        keepalive 256;
        keepalive_requests 100000000;
    }}
    server {{
        listen {addr};
        keepalive_requests 100000000;
        location / {{
            proxy_pass http://mock;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            tcp_nodelay on;
        }}
    }}
}}
"""


def nginx_one(args, count, mock_url, workdir):
    """Total instructions of nginx under callgrind serving `count` requests."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        sys.exit("--nginx: nginx is not installed (apt-get install nginx)")
    out = os.path.join(workdir, f"nginx.{count}.out")
    config = os.path.join(workdir, "nginx.conf")
    # nginx takes a port, not 0: one the kernel just handed out, released at once.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(config, "w") as f:
        f.write(NGINX_CONFIG.format(master="off", workers=1, r=workdir,
                                    mock=mock_url.removeprefix("http://"),
                                    addr=f"127.0.0.1:{port}"))
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                             "--dump-instr=yes", *CACHE_SIM, nginx, "-c", config, "-p", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + STARTUP_LIMIT
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                sys.exit("nginx did not start under valgrind")
            time.sleep(0.1)
    drive(("127.0.0.1", port), args.api, count, args.stream)
    # SIGQUIT: graceful stop, after which callgrind writes its profile.
    proc.send_signal(signal.SIGQUIT)
    proc.wait(timeout=STARTUP_LIMIT)
    return int(re.search(r"^summary: (\d+)", open(out).read(), re.M).group(1))


def floor_one(args, count, mock_url, workdir):
    """Total instructions of examples/hyper_floor.rs under callgrind serving `count` requests."""
    if not os.path.exists(args.floor):
        sys.exit(f"--floor: {args.floor} is missing (cargo build --release --example hyper_floor)")
    out = os.path.join(workdir, f"floor.{count}.out")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=yes",
           *CACHE_SIM, args.floor, "127.0.0.1:0", mock_url]
    proc, rest = start(cmd, "hyper floor listening on ", {})
    drive(host_port(rest), args.api, count, args.stream)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=STARTUP_LIMIT)
    return int(re.search(r"^summary: (\d+)", open(out).read(), re.M).group(1))


def cache_misses(few_path, many_path, n):
    """Simulated first-level misses per request (instruction, data read, data write) and the
    caches callgrind modelled, from the two profiles' totals."""
    def totals(path):
        text = open(path).read()
        events = re.search(r"^events: (.*)$", text, re.M).group(1).split()
        counts = re.search(r"^(?:summary|totals): (.*)$", text, re.M).group(1).split()
        caches = re.findall(r"^desc: (I1|D1) cache: +(\d+) B", text, re.M)
        return dict(zip(events, map(int, counts))), caches
    (few, _), (many, caches) = totals(few_path), totals(many_path)
    per = {k: (many[k] - few[k]) / n for k in ("I1mr", "D1mr", "D1mw")}
    model = ", ".join(f"{name} {int(size) // 1024} KiB" for name, size in caches)
    return (f"instruction {per['I1mr']:,.0f}, data read {per['D1mr']:,.0f}, "
            f"data write {per['D1mw']:,.0f} ({model})")


def report(label, name, few, many, args, what, workdir):
    """Prints instructions and code touched per request from the two runs' profiles."""
    n = args.many - args.few
    print(f"{label}instructions per request ({what}): {(many - few) / n:,.0f}")
    touched = footprint.per_request(
        *(os.path.join(workdir, f"{name}.{c}.out") for c in (args.few, args.many)), n)
    print(f"{label}code touched per request ({what}): {footprint.describe(*touched)}")
    if args.by_file:
        rows = byfile.per_request(
            *(os.path.join(workdir, f"{name}.{c}.out") for c in (args.few, args.many)), n)
        print(f"{label}instructions per request by source ({what}):")
        print(byfile.describe(rows, args.by_file))
    if CACHE_SIM:
        print(f"{label}cache misses per request ({what}): "
              + cache_misses(*(os.path.join(workdir, f"{name}.{c}.out")
                               for c in (args.few, args.many)), n))
    if args.atomics and name == "callgrind":
        rows, total = atomics.per_request(
            args.bin, *(os.path.join(workdir, f"{name}.{c}.out") for c in (args.few, args.many)), n)
        print(f"{label}locked instructions per request by source ({what}):")
        print(atomics.describe(rows, total))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default="target/release/legate")
    parser.add_argument("--api", default="messages", choices=["messages", "responses"])
    parser.add_argument("--few", type=int, default=200)
    parser.add_argument("--many", type=int, default=1200)
    parser.add_argument("--tool", default="both", choices=["callgrind", "dhat", "both"])
    parser.add_argument("--keep", help="directory to keep valgrind's output files in")
    parser.add_argument("--floor", nargs="?", const="target/release/examples/hyper_floor",
                        help="count examples/hyper_floor.rs (bare hyper proxy) too (callgrind)")
    parser.add_argument("--nginx", action="store_true",
                        help="count nginx in front of the same mock too (callgrind)")
    parser.add_argument("--stream", action="store_true",
                        help="streamed requests (\"stream\": true) instead of whole answers")
    parser.add_argument("--blocks", type=int, default=1,
                        help="text blocks per answer (default 1): more make longer streams")
    parser.add_argument("--by-file", type=int, metavar="ROWS",
                        help="also list instructions per request by source file or crate, the "
                             "largest ROWS (callgrind; needs a build with line tables, see "
                             "byfile.py)")
    parser.add_argument("--cache-sim", action="store_true",
                        help="also simulate the caches and print first-level misses per "
                             "request (callgrind)")
    parser.add_argument("--atomics", action="store_true",
                        help="also count the locked (atomic) instructions a request runs, by "
                             "source (callgrind; needs a build with line tables, see "
                             "atomics.py)")
    parser.add_argument("--sdk-headers", action="store_true",
                        help="send an official SDK's request headers (user-agent, accept, "
                             "X-Stainless-*) too")
    parser.add_argument("--one-send", action="store_true",
                        help="write each request's head and body in one send, so that every "
                             "request takes the same path (steadier counts to compare builds)")
    args = parser.parse_args()
    global WITH_SDK_HEADERS, ONE_SEND, CACHE_SIM
    WITH_SDK_HEADERS = args.sdk_headers
    ONE_SEND = args.one_send
    CACHE_SIM = ["--cache-sim=yes"] if args.cache_sim else []
    tools = ["callgrind", "dhat"] if args.tool == "both" else [args.tool]
    mock, mock_url = start([args.bin, "mock", "--listen", "127.0.0.1:0"],
                           "legate mock listening on ", ENV)
    try:
        conn = http.client.HTTPConnection(*host_port(mock_url), timeout=10)
        script = {"default": {"content": SCRIPT["default"]["content"] * args.blocks}}
        conn.request("PUT", "/_mock/script", json.dumps(script).encode(),
                     {"content-type": "application/json"})
        assert conn.getresponse().status == 200
        n = args.many - args.few
        what = f"{args.api}, streamed" if args.stream else args.api
        if args.blocks != 1:
            what += f", {args.blocks} text blocks"
        if args.sdk_headers:
            what += ", an SDK's headers"
        with tempfile.TemporaryDirectory() as scratch:
            workdir = args.keep or scratch
            os.makedirs(workdir, exist_ok=True)
            for tool in tools:
                few = one(args, tool, args.few, mock_url, workdir)
                many = one(args, tool, args.many, mock_url, workdir)
                if tool == "callgrind":
                    report("", "callgrind", few, many, args, what, workdir)
                else:
                    print(f"allocations per request ({what}): {(many[1] - few[1]) / n:,.1f}"
                          f"; bytes allocated per request: {(many[0] - few[0]) / n:,.0f}")
            for wanted, name, run, label in ((args.floor, "floor", floor_one, "hyper floor "),
                                             (args.nginx, "nginx", nginx_one, "nginx ")):
                if wanted:
                    few = run(args, args.few, mock_url, workdir)
                    many = run(args, args.many, mock_url, workdir)
                    report(label, name, few, many, args, what, workdir)
    finally:
        mock.kill()
        mock.wait()


if __name__ == "__main__":
    main()
