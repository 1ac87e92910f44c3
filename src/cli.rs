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
        /// Config file (else $LEGATE_CONFIG, else ./config/legate.toml, else the embedded default).
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
        /// Also play Bedrock, Vertex AI, Azure OpenAI and their credential endpoints.
        #[arg(long)]
        cloud: bool,
        /// Lifetime of every credential the cloud endpoints issue (with --cloud).
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        credential_ttl: std::time::Duration,
        /// The key the fake Azure deployments accept in `api-key` (with --cloud).
        #[arg(long)]
        azure_api_key: Option<String>,
        /// A static access key pair, ID:SECRET, the fake Bedrock accepts (with --cloud).
        #[arg(long)]
        aws_static_key: Option<String>,
    },
    /// Run the bundled headless agent loop through legate.
    #[command(
        after_help = "Exit codes: 0 finished, 1 could not run, 2 max turns, 3 token budget, \
                      4 truncated reply, 5 upstream error, 64 a command line that cannot run, \
                      130 cancelled (Ctrl-C; 143 on SIGTERM, 129 on SIGHUP)."
    )]
    Agent(crate::agent::AgentArgs),
}
