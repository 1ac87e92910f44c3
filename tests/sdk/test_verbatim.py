"""An official SDK's header lines reach an HTTP/1 provider as the SDK wrote them (its name case,
its values), with legate's credential in place of the caller's: seen by a provider that keeps
each request head as raw bytes, against the lines the SDK's own HTTP client sent."""

import json
import socket
import threading

import anthropic
import openai
import pytest

from conftest import PROVIDER_KEY, _stop, start_legate

# The lines that never go on as they came: the hop's own, the caller's credentials, and what
# legate sets itself (README, "Request headers legate reads").
NOT_FORWARDED = {"host", "connection", "accept-encoding", "content-length", "x-api-key",
                 "authorization", "transfer-encoding", "keep-alive", "te"}

MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
           "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
           "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1}}
CHAT = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


class RawProvider:
    """An HTTP/1 provider on 127.0.0.1 that keeps every request head it reads, as bytes."""

    def __init__(self):
        self.heads = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(10)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        conn.settimeout(10)
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.split(b"\r\n")
                length = next(int(line.split(b":", 1)[1]) for line in lines
                              if line.lower().startswith(b"content-length:"))
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                self.heads.append(head + b"\r\n")
                body = json.dumps(CHAT if b"/chat/" in lines[0] else MESSAGE).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n" % len(body) + body)

    def close(self):
        self.sock.close()


@pytest.fixture
def provider():
    p = RawProvider()
    yield p
    p.close()


@pytest.fixture
def legate_url(provider, tmp_path):
    proc, served = start_legate(provider.url, tmp_path)
    yield served.url
    _stop(proc)


def recording_client(sdk):
    """The SDK's own HTTP client, keeping the header lines each request goes out with, as
    written."""
    sent = []
    hooks = {"request": [lambda r: sent.append(list(r.headers.raw))]}
    return sdk.DefaultHttpxClient(event_hooks=hooks), sent


@pytest.mark.parametrize("sdk", ["anthropic", "openai"])
def test_an_sdks_lines_reach_the_provider_as_the_sdk_wrote_them(provider, legate_url, sdk):
    http, sent = recording_client(anthropic if sdk == "anthropic" else openai)
    if sdk == "anthropic":
        client = anthropic.Anthropic(base_url=legate_url, api_key="dummy-client-key",
                                     http_client=http, max_retries=0)
        client.messages.create(model="claude-x", max_tokens=5,
                               messages=[{"role": "user", "content": "hi"}],
                               extra_headers={"anthropic-beta": "feature-a"})
        credential = f"x-api-key: {PROVIDER_KEY}"
    else:
        client = openai.OpenAI(base_url=legate_url + "/v1", api_key="dummy-client-key",
                               http_client=http, max_retries=0)
        client.chat.completions.create(model="gpt-x",
                                       messages=[{"role": "user", "content": "hi"}])
        credential = f"authorization: Bearer {PROVIDER_KEY}"
    assert len(sent) == 1 and len(provider.heads) == 1
    head = provider.heads[0].decode()
    forwarded = [(n.decode(), v.decode()) for n, v in sent[0]
                 if n.decode().lower() not in NOT_FORWARDED]
    assert len(forwarded) >= 8, sent[0]
    for name, value in forwarded:
        assert f"\r\n{name}: {value}\r\n" in head, (name, head)
    assert "dummy-client-key" not in head
    lines = head.split("\r\n")
    assert [line for line in lines if line.lower().startswith(credential.split(":")[0] + ":")] \
        == [credential]
