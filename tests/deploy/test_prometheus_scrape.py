"""A real Prometheus scrapes a real legate: `legate mock` as the provider, `legate serve` in
front of it, N requests through legate, then `prometheus` on a free loopback port scraping the
admin plane every second, until its query API reports legate_requests_total summed to N."""

import json
import socket
import time
import urllib.parse
import urllib.request

import yaml

N_REQUESTS = 3
SCRAPE_DEADLINE_S = 30
BODY = json.dumps({"model": "m", "max_tokens": 5, "messages": []}).encode()


def _urls(line):
    return [w.strip("()") for w in line.split() if w.strip("()").startswith("http://")]


def _start_legate(spawn, legate_bin, tmp_path):
    mock = spawn("mock", [legate_bin, "mock", "--listen", "127.0.0.1:0"])
    line = mock.first_line()
    assert line.startswith("legate mock listening on http://127.0.0.1:"), line
    mock_url = _urls(line)[0]

    config = tmp_path / "legate.toml"
    config.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[providers.anthropic]
kind = "anthropic"
base_url = "{mock_url}"
api_key_env = "ANTHROPIC_API_KEY"

[providers.openai]
kind = "openai"
base_url = "{mock_url}"
api_key_env = "OPENAI_API_KEY"
""",
        encoding="utf-8",
    )
    legate = spawn(
        "legate",
        [legate_bin, "serve", "--config", config],
        env={"ANTHROPIC_API_KEY": "sk-mock", "OPENAI_API_KEY": "sk-mock"},
    )
    line = legate.first_line()
    assert line.startswith("legate listening on http://127.0.0.1:"), line
    data_url, admin_url = _urls(line)
    return data_url, admin_url


def _send_messages(data_url):
    for _ in range(N_REQUESTS):
        req = urllib.request.Request(
            data_url + "/v1/messages",
            data=BODY,
            method="POST",
            headers={"content-type": "application/json", "anthropic-version": "2023-06-01"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
            assert json.loads(resp.read())["type"] == "message"


def _free_port():
    # The port is released before Prometheus binds it; _start_prometheus retries if another
    # process took it in between.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url):
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _ready(url):
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _start_prometheus(spawn, prometheus_bin, tmp_path, admin_url):
    admin_target = urllib.parse.urlsplit(admin_url).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [
                    {"job_name": "legate", "static_configs": [{"targets": [admin_target]}]}
                ],
            }
        ),
        encoding="utf-8",
    )
    for attempt in range(3):
        port = _free_port()
        server = spawn(
            f"prometheus-{attempt}",
            [
                prometheus_bin,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / f'tsdb-{attempt}'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            announce=False,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + SCRAPE_DEADLINE_S
        while time.monotonic() < deadline and server.alive():
            if _ready(url):
                return url
            time.sleep(0.2)
        if server.alive():
            raise AssertionError(f"prometheus never became ready; log:\n{server.log_tail()}")
        # Exited: most likely the port was taken after _free_port released it. Try another.
    raise AssertionError(f"prometheus did not start; log:\n{server.log_tail()}")


def _query_scalar(prom_url, promql):
    """The value of a single-sample instant query, or None while there is none."""
    url = prom_url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = _get_json(url)
    assert body["status"] == "success", body
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def _poll(prom_url, promql, want):
    """Polls the query until it returns `want` or the deadline passes; returns the last value."""
    deadline = time.monotonic() + SCRAPE_DEADLINE_S
    value = None
    while time.monotonic() < deadline:
        value = _query_scalar(prom_url, promql)
        if value == want:
            break
        time.sleep(0.25)
    return value


def test_prometheus_scrapes_request_count(spawn, legate_bin, prometheus_bin, tmp_path):
    data_url, admin_url = _start_legate(spawn, legate_bin, tmp_path)
    _send_messages(data_url)

    prom_url = _start_prometheus(spawn, prometheus_bin, tmp_path, admin_url)

    total = _poll(prom_url, "sum(legate_requests_total)", N_REQUESTS)
    assert total == N_REQUESTS, f"sum(legate_requests_total) = {total}, want {N_REQUESTS}"

    # The scrape itself is healthy, and the count is where the labels say it is.
    assert _query_scalar(prom_url, 'up{job="legate"}') == 1
    ok = _query_scalar(
        prom_url, 'sum(legate_requests_total{api="anthropic", status="200", tenant="default"})'
    )
    assert ok == N_REQUESTS
