//! Command-line structure (clap) only; dispatch lives in `main.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "legate",
    version,
    about = "A model ambassador: the localhost proxy between your agents and their LLM providers"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy.
    Serve {
        /// Config file (else $LEGATE_CONFIG, else ./config/legate.toml, else the embedded default).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Validate a config and print it, secrets masked. Exit 0 valid, 1 invalid.
    Check {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Run a fake Anthropic + OpenAI provider with scripted replies and faults.
    Mock {
        #[arg(long, default_value = "127.0.0.1:8790")]
        listen: SocketAddr,
        /// JSON script of replies and faults (see README).
        #[arg(long)]
        script: Option<PathBuf>,
    },
    /// Run the bundled headless agent loop through legate.
    #[command(
        after_help = "Exit codes: 0 finished, 1 could not run, 2 max turns, 3 token budget, \
                      4 truncated reply, 5 upstream error, 130 cancelled (Ctrl-C)."
    )]
    Agent(crate::agent::AgentArgs),
}
