//! Entry point: parse the command line, load config (before binding anything), start telemetry,
//! and hand over to the library.

use std::process::ExitCode;

use clap::Parser;
use legate::cli::{Cli, Command};
use legate::config;

/// sysexits EX_CONFIG-style code for a config that does not validate (`serve`).
const EXIT_BAD_CONFIG: u8 = 64;
/// sysexits EX_USAGE, for a command line the parser rejects. Not clap's default 2: that is
/// `legate agent`'s "max turns", and a script must be able to tell a typo from a limit.
const EXIT_USAGE: u8 = legate::agent::EXIT_USAGE as u8;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // --help and --version come this way too, as successes.
            return if e.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Check { config } => check(config.as_deref()),
        Command::Agent(args) => agent(args),
        Command::Serve { config } => serve(config.as_deref()),
        Command::Mock {
            listen,
            script,
            cloud,
            credential_ttl,
            azure_api_key,
            aws_static_key,
        } => {
            legate::telemetry::init_tracing(&config::log_filter());
            let cloud = cloud.then(|| legate::mock::CloudOptions {
                credential_ttl,
                azure_api_key,
                aws_static_key: aws_static_key
                    .and_then(|k| k.split_once(':').map(|(a, b)| (a.to_owned(), b.to_owned()))),
            });
            block_on(legate::mock::run(listen, script, cloud))
        }
    }
}

use std::io::Write as _;

fn check(path: Option<&std::path::Path>) -> ExitCode {
    match config::load(path) {
        Ok((cfg, origin)) => {
            // A reader that stops early (`legate check | head`) is not an error of the
            // config's: the exit code still says whether it is valid.
            let _ = writeln!(
                std::io::stdout().lock(),
                "{}",
                config::render::render_masked(&cfg)
            );
            for w in config::render::warnings(&cfg) {
                eprintln!("warning: {w}");
            }
            eprintln!("config from {origin} is valid");
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{}: {}", e.path, e.message);
            }
            ExitCode::from(1)
        }
    }
}

fn serve(path: Option<&std::path::Path>) -> ExitCode {
    let (cfg, origin) = match config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{}: {}", e.path, e.message);
            }
            eprintln!("legate: invalid config; nothing was started");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    let log = &cfg.observe.log;
    legate::observe::logfmt::init(log.format, &config::log_filter_or(&log.level));
    for w in config::render::warnings(&cfg) {
        tracing::warn!("{w}");
    }
    tracing::info!(config = %origin, "config loaded");
    // A reload re-reads the config from the same place, with the environment as it is then:
    // the same file (missing, it is an error, never the embedded default), or the embedded
    // default again (never a file that appeared since).
    let from = origin.clone();
    let source: legate::server::ConfigSource =
        std::sync::Arc::new(move || config::load_again(&from));
    let rt = match serve_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("legate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let served = rt.block_on(legate::server::run(
        cfg,
        prometheus::Registry::new(),
        source,
    ));
    // Dropped, the runtime would wait for every blocking thread: one stuck reading a file on a
    // hung mount would keep the process from exiting after its drain.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("legate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The runtime `legate serve` starts on: tokio's current-thread scheduler, on this thread.
/// It runs the admin plane and the housekeeping, and is the data plane's first worker; with
/// `server.worker_threads` above one the server starts the others, each a current-thread
/// runtime of its own (`legate::server::workers` says why not tokio's multi-thread one).
///
/// The blocking pool (metrics and admin rendering, reloads, token estimates, DNS lookups, file
/// reads) is kept small and short-lived: every thread that allocates gets a malloc arena of its
/// own, whose pages stay resident after the burst that needed it (tokio's default is up to 512
/// threads, idle for 10 s). Eight leave room beside the four token estimates that may run at
/// once; an idle one exits after 2 s.
fn serve_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(8)
        .thread_keep_alive(std::time::Duration::from_secs(2))
        .enable_all()
        .build()
}

/// `legate agent`: the loop's own exit codes (SPEC §9) become the process's.
fn agent(args: legate::agent::AgentArgs) -> ExitCode {
    let Some(rt) = runtime() else {
        return ExitCode::FAILURE;
    };
    let code = rt.block_on(legate::agent::run(args));
    // A terminal prompt left unanswered after Ctrl-C holds a blocking thread; do not wait for it.
    rt.shutdown_background();
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn block_on(fut: impl std::future::Future<Output = Result<(), String>>) -> ExitCode {
    let Some(rt) = runtime() else {
        return ExitCode::FAILURE;
    };
    match rt.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("legate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The one place the tokio runtime is built; None (reported) if the OS refuses it.
fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("legate: cannot start the runtime: {e}");
            None
        }
    }
}
