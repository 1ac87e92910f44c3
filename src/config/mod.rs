//! Configuration: where it comes from (`load`), the file as serde reads it (`file`, through
//! `de` and the value syntaxes of `adapt`), what it must satisfy beyond that (`validate`), the
//! provider credentials it names (`secret`), and how it is shown to an operator (`render`).
//!
//! This is the only part of legate that reads the process environment; everything else
//! receives a validated [`Config`].

use std::fmt;

pub mod adapt;
pub mod aws_profile;
pub mod cloud;
mod de;
pub mod file;
pub mod load;
pub mod observe;
pub(crate) mod read;
pub mod render;
pub mod secret;
pub(crate) mod shown;
pub(crate) mod tls;
pub mod types;
pub mod validate;

pub use load::{
    DEFAULT_TOML, Origin, load, load_again, load_str, load_with_env, log_filter, log_filter_or,
};
pub use render::{config_hash, render_masked, warnings};
pub use secret::{KeyCell, KeySource, Secret};
pub use types::*;

/// One problem in a configuration, located by its key path
/// (`providers.anthropic.connect_timeout`, `models[1].chain[0]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found in a configuration, so an operator fixes them in one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// True when some problem is reported at exactly `path`.
    pub fn has_path(&self, path: &str) -> bool {
        self.0.iter().any(|e| e.path == path)
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        Self(vec![e])
    }
}
