"""The Dockerfile, checked without a Docker daemon: its stages and runtime settings, that the
build context (.dockerignore) holds every build input, and that the dependency layer's stub
sources still satisfy Cargo.toml. hadolint lints it in .ci/deploy-checks."""

import fnmatch
import json
import pathlib
import re
import shutil
import subprocess

import pytest

import deploytool
from deploytool import ROOT

BUILDER_IMAGE = "rust:1-bookworm"
RUNTIME_IMAGE = "gcr.io/distroless/cc-debian12:nonroot"


def instructions():
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for raw in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages():
    """Lists of instructions, one per FROM."""
    result = []
    for ins in instructions():
        if ins[0] == "FROM":
            result.append([])
        result[-1].append(ins)
    return result


def context_includes(rel):
    """Whether .dockerignore lets `rel` (a path relative to the repo) into the build context:
    patterns in order, the last one matching decides, `!` re-includes, a directory pattern
    covers everything below it."""
    included = True
    for raw in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        parts = pathlib.PurePosixPath(rel).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            included = negate
    return included


def copied_sources():
    """Build-context paths that COPY instructions (without --from) bring in."""
    sources = []
    for word, args in instructions():
        if word == "COPY" and "--from=" not in args:
            sources.extend(args.split()[:-1])
    return sources


def test_two_stages_on_the_agreed_images():
    builder, runtime = stages()
    assert builder[0] == ("FROM", f"{BUILDER_IMAGE} AS builder")
    assert runtime[0] == ("FROM", RUNTIME_IMAGE)
    runs = " ".join(args for word, args in builder if word == "RUN")
    assert "cargo build --release --locked" in runs
    # distroless has no shell: nothing may RUN in the runtime stage.
    assert not [ins for ins in runtime if ins[0] == "RUN"]


def test_runtime_is_non_root_exposes_both_planes_and_serves_the_mounted_config():
    runtime = {w: a for w, a in stages()[-1] if w in {"USER", "EXPOSE", "ENTRYPOINT", "CMD"}}
    uid = runtime["USER"].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root user, verifiable by runAsNonRoot"
    assert set(runtime["EXPOSE"].split()) == {"8787", "9787"}
    command = json.loads(runtime["ENTRYPOINT"]) + json.loads(runtime["CMD"])
    assert command == ["/usr/local/bin/legate", "serve", "--config", "/etc/legate/legate.toml"]

    # The Kubernetes sidecar passes the same arguments and mounts its ConfigMap there.
    pod = deploytool.load_yaml(deploytool.K8S / "deployment.yaml")["spec"]["template"]["spec"]
    (legate,) = [c for c in pod["initContainers"] if c["name"] == "legate"]
    assert legate["args"] == command[1:]
    assert "/etc/legate" in {m["mountPath"] for m in legate["volumeMounts"]}
    assert legate["securityContext"]["runAsUser"] == int(uid)


def test_every_copied_path_is_in_the_build_context():
    for source in copied_sources():
        assert (ROOT / source).exists(), source
        assert context_includes(source), f"{source} is excluded by .dockerignore"
    # Large or private things stay out.
    for path in ("target/debug/legate", ".git/HEAD", "tests/it/main.rs"):
        assert not context_includes(path), path


def test_files_the_build_includes_are_copied_into_the_builder():
    """include_str!/include_bytes! targets and a build script must reach the builder stage."""
    copied = [pathlib.PurePosixPath(s) for s in copied_sources()]

    def is_copied(rel):
        return any(rel == c or c in rel.parents for c in copied)

    needed = []
    for source in (ROOT / "src").rglob("*.rs"):
        for target in re.findall(r'include_(?:str|bytes)!\(\s*"([^"]+)"', source.read_text()):
            needed.append((source.parent / target).resolve().relative_to(ROOT))
    if (ROOT / "build.rs").exists():
        needed.append(pathlib.Path("build.rs"))
    if (ROOT / "link/symbol-order.txt").exists():
        needed.append(pathlib.Path("link/symbol-order.txt"))
    # The rustc wrapper cargo is configured with, and the profile it hands to rustc.
    for rel in (".cargo/config.toml", "link/rustc-pgo", "link/legate.profdata",
                "link/legate.profdata.llvm"):
        needed.append(pathlib.Path(rel))
    assert pathlib.Path("config/legate.toml") in needed, "the embedded default config"
    for rel in needed:
        rel = pathlib.PurePosixPath(rel.as_posix())
        assert context_includes(str(rel)), f"{rel} is excluded by .dockerignore"
        assert is_copied(rel), f"{rel} is needed by the build but not copied by the Dockerfile"


def test_dependency_layer_stubs_satisfy_the_manifest(tmp_path):
    """Runs the Dockerfile's stub step, then its other COPYs, with `cargo build` swapped for
    `cargo fetch` (which loads the manifest without compiling): a target that Cargo.toml
    declares without a path and that the stubs do not create fails here, not in a build."""
    if shutil.which("cargo") is None:
        pytest.fail("cargo is needed to check the Dockerfile's dependency layer")
    builder = stages()[0]
    index = builder.index(("COPY", "Cargo.toml Cargo.lock ./"))
    # The dependencies are compiled in that layer: the wrapper and its profile must be there.
    early = " ".join(args for word, args in builder[:index] if word == "COPY")
    for rel in (".cargo", "link/rustc-pgo", "link/legate.profdata"):
        assert rel in early, f"{rel} is copied after the dependency layer"
    word, script = builder[index + 1]
    assert word == "RUN" and "cargo build --release --locked" in script
    for name in ("Cargo.toml", "Cargo.lock"):
        shutil.copy(ROOT / name, tmp_path / name)
    # The builder's SHELL, with -e: `docker build` stops at the first failing command too.
    shells = [json.loads(args) for word, args in builder if word == "SHELL"]
    shell = shells[-1] if shells else ["/bin/sh", "-c"]
    script = script.replace("cargo build --release --locked", "cargo fetch --locked")
    result = subprocess.run(
        [*shell[:-1], "-e", shell[-1], script],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    # Then the real build's inputs arrive, and the manifest must still load.
    for word, args in builder[index + 2 :]:
        if word == "COPY" and "--from=" not in args:
            source, dest = args.split()
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, tmp_path / dest)
            else:
                shutil.copy(ROOT / source, tmp_path / dest)
    result = subprocess.run(
        ["cargo", "fetch", "--locked"], check=False, cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
