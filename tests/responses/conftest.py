"""Fixtures for the Responses client suite: the same as tests/clients' (loaded from there, so the
two suites share one definition yet run as separate pytest sessions), with the executables taken
from this suite's own node_modules (Codex and the OpenAI Node SDK)."""

import importlib.util
import pathlib

_SHARED = pathlib.Path(__file__).resolve().parents[1] / "clients" / "conftest.py"
_spec = importlib.util.spec_from_file_location("legate_client_fixtures", _SHARED)
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
globals().update({k: v for k, v in vars(_shared).items() if not k.startswith("__")})

HERE = pathlib.Path(__file__).resolve().parent
NODE_MODULES = HERE / "node_modules"


def node_bin(name):
    """A client's executable from tests/responses/node_modules; missing means a failed install,
    which fails the test (the suite never skips a client)."""
    path = NODE_MODULES / ".bin" / name
    assert path.exists(), f"{path} is missing: run `npm ci` in tests/responses"
    return str(path)
