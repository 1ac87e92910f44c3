# legate container image: a release build on Debian bookworm, run on distroless (glibc, CA
# certificates, no shell, no package manager) as the unprivileged user 65532.
#
#   docker build -t legate:0.1.0 .
#   docker run --rm legate:0.1.0 check --config /etc/legate/legate.toml
#
# The image writes no files, so it runs with a read-only root filesystem. It is meant to run
# beside an agent in the same network namespace (a Kubernetes pod, or
# `docker run --network container:AGENT`): the data plane stays on 127.0.0.1:8787, and the pod's
# config opens the admin plane (9787) for probes and Prometheus. See deploy/README.md.

FROM rust:1-bookworm AS builder
WORKDIR /src

# Strip symbols from the release binary (a smaller image) without touching Cargo.toml. Set
# before the dependency layer: changing it later would rebuild every dependency.
ENV CARGO_PROFILE_RELEASE_STRIP=symbols

# Dependency layer: build every dependency against stub sources, so that a change to legate's
# own code reuses this layer and recompiles only the crate itself. Only the library and the
# binary are built; a [[bench]] or [[bin]] declared without `path` must exist for Cargo to
# load the manifest, and would need a stub here too (tests/deploy/test_dockerfile.py runs
# this step against the current Cargo.toml).
# Optimised builds use the committed profile of a serving run (profile-guided optimisation, see
# link/rustc-pgo): the wrapper cargo runs rustc through and the profile come before the
# dependency layer, so that the dependencies are built with it too.
COPY .cargo ./.cargo
COPY link/rustc-pgo link/legate.profdata link/legate.profdata.llvm ./link/
COPY Cargo.toml Cargo.lock ./
RUN mkdir src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && cargo build --release --locked \
    && rm -rf src

# legate itself. config/ is needed at build time: the default config is compiled in.
COPY build.rs ./
# The functions to place side by side at the start of the code (see build.rs); a list made with
# another rustc than the image's matches no symbol and changes nothing.
COPY link ./link
COPY src ./src
COPY config ./config
# COPY keeps the sources' modification times, which may be older than the stub build above:
# touch them so cargo sees the crate as changed.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin legate

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="legate" \
      org.opencontainers.image.description="A model ambassador: the localhost proxy between agents and their LLM providers" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=builder /src/target/release/legate /usr/local/bin/legate
# The documented defaults, so the image starts without a mounted config. Kubernetes mounts
# its ConfigMap over /etc/legate.
COPY config/legate.toml /etc/legate/legate.toml

# Numeric, so that Kubernetes can verify runAsNonRoot against the image.
USER 65532:65532
# 8787: data plane (loopback only by default), 9787: admin plane (/healthz /readyz /metrics).
EXPOSE 8787 9787
# SIGTERM (the default stop signal) drains: readiness off, in-flight requests finish within
# server.shutdown_grace, exit 0.
ENTRYPOINT ["/usr/local/bin/legate"]
CMD ["serve", "--config", "/etc/legate/legate.toml"]
