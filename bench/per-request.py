#!/usr/bin/env python3
"""Instructions and heap allocations legate spends per proxied request, counted by valgrind.

Deterministic where wall-clock numbers are not (a shared machine moves them): legate serve runs
under valgrind (callgrind for instructions, DHAT for allocations) in front of `legate mock`, and
serves two counts of sequential keep-alive requests; the difference of the totals divided by the
difference of the counts is the cost of one request, start-up and shutdown cancelling out.

    python3 bench/per-request.py [--bin target/release/legate] [--api messages|responses]
                                 [--few 200] [--many 1200] [--tool callgrind|dhat|both]
                                 [--stream]

`--stream` asks for `"stream": true` answers (the mock's event stream, read to its end), to
count what a streamed request costs instead of a whole answer.
"""

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

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


def drive(addr, api, count, stream):
    path, body, headers = {
        "messages": ("/v1/messages", MESSAGE,
                     {"anthropic-version": "2023-06-01", "x-api-key": "bench-caller-key"}),
        "responses": ("/v1/responses", RESPONSE, {"authorization": "Bearer bench-caller-key"}),
    }[api]
    payload = json.dumps({**body, "stream": True} if stream else body).encode()
    headers = {**headers, "content-type": "application/json"}
    conn = http.client.HTTPConnection(*addr, timeout=60)
    for _ in range(count):
        conn.request("POST", path, payload, headers)
        reply = conn.getresponse()
        reply.read()
        if reply.status != 200:
            sys.exit(f"{path}: status {reply.status}")
    conn.close()


def one(args, tool, count, mock_url, workdir):
    out = os.path.join(workdir, f"{tool}.{count}.out")
    config = os.path.join(workdir, "legate.toml")
    with open(config, "w") as f:
        f.write(CONFIG.format(mock=mock_url))
    opts = {"callgrind": [f"--callgrind-out-file={out}"],
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default="target/release/legate")
    parser.add_argument("--api", default="messages", choices=["messages", "responses"])
    parser.add_argument("--few", type=int, default=200)
    parser.add_argument("--many", type=int, default=1200)
    parser.add_argument("--tool", default="both", choices=["callgrind", "dhat", "both"])
    parser.add_argument("--keep", help="directory to keep valgrind's output files in")
    parser.add_argument("--stream", action="store_true",
                        help="streamed requests (\"stream\": true) instead of whole answers")
    args = parser.parse_args()
    tools = ["callgrind", "dhat"] if args.tool == "both" else [args.tool]
    mock, mock_url = start([args.bin, "mock", "--listen", "127.0.0.1:0"],
                           "legate mock listening on ", ENV)
    try:
        conn = http.client.HTTPConnection(*host_port(mock_url), timeout=10)
        conn.request("PUT", "/_mock/script", json.dumps(SCRIPT).encode(),
                     {"content-type": "application/json"})
        assert conn.getresponse().status == 200
        n = args.many - args.few
        what = f"{args.api}, streamed" if args.stream else args.api
        with tempfile.TemporaryDirectory() as scratch:
            workdir = args.keep or scratch
            os.makedirs(workdir, exist_ok=True)
            for tool in tools:
                few = one(args, tool, args.few, mock_url, workdir)
                many = one(args, tool, args.many, mock_url, workdir)
                if tool == "callgrind":
                    print(f"instructions per request ({what}): {(many - few) / n:,.0f}")
                else:
                    print(f"allocations per request ({what}): {(many[1] - few[1]) / n:,.1f}"
                          f"; bytes allocated per request: {(many[0] - few[0]) / n:,.0f}")
    finally:
        mock.kill()
        mock.wait()


if __name__ == "__main__":
    main()
