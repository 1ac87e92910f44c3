//! Where the configuration comes from: an explicit path, `$LEGATE_CONFIG`,
//! `./config/legate.toml`, or the embedded default; then `LEGATE__SECTION__KEY` environment
//! overrides merged on top (the `config` crate's convention), then validation.
//!
//! Paths inside the configuration (`ca_file`, `api_key_file`, …) are used as written: a
//! relative path is relative to the working directory of the process.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use config::{Environment, File, FileFormat, ValueKind};

use crate::config::file::FileConfig;
use crate::config::{Config, ConfigError, ConfigErrors, de, validate};

/// The embedded default: identical to `config/legate.toml`.
pub const DEFAULT_TOML: &str = include_str!("../../config/legate.toml");

/// Read when the working directory has one, before falling back to the embedded default.
const LOCAL_CONFIG: &str = "config/legate.toml";

/// Providers assumed when a file has no `[providers]` section at all, as documented. A file
/// that has the section gets exactly the providers it lists.
const DEFAULT_PROVIDERS_TOML: &str = r#"
[providers.anthropic]
kind = "anthropic"
base_url = "https://api.anthropic.com"
api_key_env = "ANTHROPIC_API_KEY"

[providers.openai]
kind = "openai"
base_url = "https://api.openai.com"
api_key_env = "OPENAI_API_KEY"
"#;

/// Where the config came from, for logs and `check` output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `--config PATH`.
    Path(PathBuf),
    /// `$LEGATE_CONFIG`.
    Env(PathBuf),
    /// `./config/legate.toml`.
    LocalFile(PathBuf),
    /// [`DEFAULT_TOML`].
    Embedded,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Path(p) => write!(f, "{} (--config)", p.display()),
            Origin::Env(p) => write!(f, "{} ($LEGATE_CONFIG)", p.display()),
            Origin::LocalFile(p) => write!(f, "{} (working directory)", p.display()),
            Origin::Embedded => f.write_str("embedded default"),
        }
    }
}

/// Loads with the process environment (SPEC §1 order; see [`load_with_env`]).
pub fn load(explicit: Option<&Path>) -> Result<(Config, Origin), ConfigErrors> {
    load_with_env(explicit, &process_env())
}

/// The same pipeline with an injected environment: the explicit path, else `$LEGATE_CONFIG`,
/// else `./config/legate.toml` if present, else [`DEFAULT_TOML`]; then `LEGATE__…` overrides.
pub fn load_with_env(
    explicit: Option<&Path>,
    env: &HashMap<String, String>,
) -> Result<(Config, Origin), ConfigErrors> {
    let origin = choose_origin(explicit, env, Path::new(LOCAL_CONFIG).is_file());
    let config = load_origin(&origin, env)?;
    Ok((config, origin))
}

/// Loads the config again from where it came from at start (a reload), with the process
/// environment as it is now. A file that went missing is an error, not a reason to fall back
/// to the embedded default; a config that came from the embedded default still does, though
/// `./config/legate.toml` may have appeared since.
pub fn load_again(origin: &Origin) -> Result<Config, ConfigErrors> {
    load_origin(origin, &process_env())
}

fn load_origin(origin: &Origin, env: &HashMap<String, String>) -> Result<Config, ConfigErrors> {
    match origin {
        Origin::Path(p) | Origin::Env(p) | Origin::LocalFile(p) => {
            let text = read_file(p)?;
            merge_and_validate(&text, env, &p.display().to_string())
        }
        Origin::Embedded => merge_and_validate(DEFAULT_TOML, env, "embedded default"),
    }
}

/// The most a config file may hold: far past any real one, short of what would take the
/// process's memory (`--config /dev/zero`).
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A config file's text: a regular file (a FIFO would hold `serve` for ever) of at most
/// [`MAX_CONFIG_BYTES`].
fn read_file(p: &Path) -> Result<String, ConfigError> {
    use std::io::Read as _;
    let refused = |why: String| ConfigError::new(p.display().to_string(), why);
    let meta = std::fs::metadata(p).map_err(|e| refused(format!("cannot read: {e}")))?;
    if !meta.is_file() {
        return Err(refused("cannot read: not a regular file".to_owned()));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(p)
        .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| refused(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(refused(format!(
            "cannot read: larger than {} MiB",
            MAX_CONFIG_BYTES >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|_| refused("cannot read: not UTF-8 text".to_owned()))
}

/// Loads a TOML text with `LEGATE__…` overrides from `env`.
pub fn load_str(toml: &str, env: &HashMap<String, String>) -> Result<Config, ConfigErrors> {
    merge_and_validate(toml, env, "")
}

/// The log filter for tracing-subscriber: `$LEGATE_LOG`, else `$RUST_LOG`, else `info`.
pub fn log_filter() -> String {
    log_filter_from(&process_env())
}

/// The log filter for `serve`: `$LEGATE_LOG`, else `$RUST_LOG`, else `[log] level`.
pub fn log_filter_or(configured: &str) -> String {
    let env = process_env();
    if ["LEGATE_LOG", "RUST_LOG"]
        .iter()
        .any(|v| env.get(*v).is_some_and(|s| !s.trim().is_empty()))
    {
        log_filter_from(&env)
    } else {
        configured.to_string()
    }
}

fn log_filter_from(env: &HashMap<String, String>) -> String {
    ["LEGATE_LOG", "RUST_LOG"]
        .iter()
        .filter_map(|var| env.get(*var))
        .find(|v| !v.trim().is_empty())
        .cloned()
        .unwrap_or_else(|| "info".to_owned())
}

/// Variables whose name or value is not Unicode cannot be legate settings or keys; skipping
/// them beats refusing to start.
fn process_env() -> HashMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

fn choose_origin(
    explicit: Option<&Path>,
    env: &HashMap<String, String>,
    local_exists: bool,
) -> Origin {
    if let Some(p) = explicit {
        return Origin::Path(p.to_path_buf());
    }
    if let Some(p) = env.get("LEGATE_CONFIG").filter(|p| !p.is_empty()) {
        return Origin::Env(PathBuf::from(p));
    }
    if local_exists {
        return Origin::LocalFile(PathBuf::from(LOCAL_CONFIG));
    }
    Origin::Embedded
}

/// Merges the TOML text and the environment overrides with the `config` crate, reads the
/// merged tree into the file mirror, then validates it. `label` names the text in syntax errors.
fn merge_and_validate(
    toml: &str,
    env: &HashMap<String, String>,
    label: &str,
) -> Result<Config, ConfigErrors> {
    check_syntax(toml, label)?;
    arrays_untouched(env)?;
    let file_only = config::Config::builder()
        .add_source(File::from_str(toml, FileFormat::Toml))
        .build()
        .map_err(|_| ConfigError::new(label, "not a valid TOML document"))?;
    let mut builder = config::Config::builder();
    let has_providers =
        matches!(&file_only.cache.kind, ValueKind::Table(m) if m.contains_key("providers"));
    if !has_providers {
        builder = builder.add_source(File::from_str(DEFAULT_PROVIDERS_TOML, FileFormat::Toml));
    }
    // Every override is read as the string it is: the typed reader (`de`) makes a number or a
    // boolean of one only where the key takes a number or a boolean. Parsed here, a string
    // that looks like a number was rewritten (a collector header `007` sent as `7`, a project
    // id `0123` as `123`), and an amount in USD went through a float.
    let overrides = Environment::with_prefix("LEGATE")
        .separator("__")
        .try_parsing(false)
        .source(Some(env.clone()));
    // The crate's message may quote an override's value, which may be a key: not shown.
    let merged = builder
        .add_source(File::from_str(toml, FileFormat::Toml))
        .add_source(overrides)
        .build()
        .map_err(|_| {
            ConfigError::new(
                "environment",
                "the LEGATE__… overrides do not fit the file (a value where a table is, or \
                 the other way round)",
            )
        })?;
    let (file, errors, failed) = de::read_all::<FileConfig>(&merged.cache);
    let result = match file {
        Some(mut file) => {
            key_source_from_env(&mut file, env);
            validate::validate(file, (errors, failed), env)
        }
        None => Err(ConfigErrors(errors)),
    };
    result.map_err(|e| name_overrides(e, env))
}

/// The `[[…]]` arrays are the file's alone: an override of one (`LEGATE__CLIENTS[0]__…`, which
/// the `config` crate would take, replacing the whole entry) is refused, naming the variable,
/// rather than changing the callers' keys or the models from the environment unnoticed.
fn arrays_untouched(env: &HashMap<String, String>) -> Result<(), ConfigErrors> {
    const ARRAYS: [&str; 4] = ["MODELS", "CLIENTS", "PRICES", "LIMITS"];
    let mut refused: Vec<ConfigError> = env
        .keys()
        .filter(|var| {
            let upper = var.to_ascii_uppercase();
            let Some(rest) = upper.strip_prefix("LEGATE__") else {
                return false;
            };
            let first = rest.split("__").next().unwrap_or_default();
            let first = first.split('[').next().unwrap_or_default();
            ARRAYS.contains(&first) || rest.contains('[')
        })
        .map(|var| {
            ConfigError::new(
                "environment",
                format!(
                    "${var}: the [[models]], [[clients]], [[prices]] and [[limits]] entries come from the config file only; set them there"
                ),
            )
        })
        .collect();
    if refused.is_empty() {
        return Ok(());
    }
    refused.sort_by(|a, b| a.message.cmp(&b.message));
    Err(ConfigErrors(refused))
}

/// Each problem whose value came from a `LEGATE__…` override says so: the file holds another
/// value, or none, and the operator looking at it would not find the one refused.
fn name_overrides(mut errors: ConfigErrors, env: &HashMap<String, String>) -> ConfigErrors {
    for e in &mut errors.0 {
        if e.path.is_empty() || e.path.contains(['[', '<', ' ']) {
            continue;
        }
        let var = format!("LEGATE__{}", e.path.replace('.', "__").to_ascii_uppercase());
        if let Some(set) = env.keys().find(|k| k.eq_ignore_ascii_case(&var)) {
            e.message.push_str(&format!(" (the value of ${set})"));
        }
    }
    errors
}

/// A provider's key source chosen in the environment replaces the file's: a key file given
/// by `LEGATE__PROVIDERS__<NAME>__API_KEY_FILE` drops the file's `api_key_env` (the embedded
/// default and the image's config set one), a variable named by `…__API_KEY_ENV` drops the
/// file's `api_key_file` (the shipped deploy configs set one), and either set empty unsets
/// its own. Else the two would be "both set", and switching a deployment from one source to
/// the other would need a config file of its own. Both set non-empty in the environment stay
/// both set, and are refused.
fn key_source_from_env(file: &mut FileConfig, env: &HashMap<String, String>) {
    let value_of = |name: &str, key: &str| {
        let var = format!("LEGATE__PROVIDERS__{name}__{key}");
        env.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(&var))
            .map(|(_, v)| v.as_str())
    };
    let names: std::collections::BTreeSet<String> = env
        .keys()
        .filter_map(|var| {
            let upper = var.to_ascii_uppercase();
            let rest = upper.strip_prefix("LEGATE__PROVIDERS__")?;
            let name = rest
                .strip_suffix("__API_KEY_FILE")
                .or_else(|| rest.strip_suffix("__API_KEY_ENV"))?;
            Some(name.to_owned())
        })
        .collect();
    for name in names {
        let Some(p) = file.providers.get_mut(&name.to_ascii_lowercase()) else {
            continue;
        };
        let (key_file, key_env) = (
            value_of(&name, "API_KEY_FILE"),
            value_of(&name, "API_KEY_ENV"),
        );
        match (key_file, key_env) {
            (Some(f), Some(e)) if !f.is_empty() && !e.is_empty() => {}
            (Some(f), _) if !f.is_empty() => p.api_key_env = None,
            (_, Some(e)) if !e.is_empty() => p.api_key_file = None,
            _ => {}
        }
        if key_file == Some("") {
            p.api_key_file = None;
        }
        if key_env == Some("") {
            p.api_key_env = None;
        }
    }
}

/// A TOML syntax error, located by line and column. The parser's own rendering quotes the
/// offending line, which may be a key pasted in the wrong place: only its message is kept.
fn check_syntax(text: &str, label: &str) -> Result<(), ConfigError> {
    let Err(e) = toml::from_str::<toml::Table>(text) else {
        return Ok(());
    };
    let at = e.span().map(|span| {
        let before = &text[..span.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        format!("line {line}, column {column}: ")
    });
    let message = e.message().lines().next().unwrap_or("invalid TOML").trim();
    Err(ConfigError::new(
        label,
        format!("{}{message}", at.unwrap_or_default()),
    ))
}

/// An environment of `pairs` alone, for tests that must not see the process's.
#[cfg(test)]
pub(crate) fn env_of(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A file `name` of `contents` in a new temporary directory, which removes it when dropped.
#[cfg(test)]
pub(crate) fn temp_file(
    name: &str,
    contents: &str,
) -> std::io::Result<(tempfile::TempDir, PathBuf)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join(name);
    std::fs::write(&path, contents)?;
    Ok((dir, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_follows_the_documented_order() {
        let none = env_of(&[]);
        let with_var = env_of(&[("LEGATE_CONFIG", "/etc/legate.toml")]);
        let explicit = Path::new("/x.toml");
        assert_eq!(
            choose_origin(Some(explicit), &with_var, true),
            Origin::Path(explicit.into())
        );
        assert_eq!(
            choose_origin(None, &with_var, true),
            Origin::Env("/etc/legate.toml".into())
        );
        assert_eq!(
            choose_origin(None, &none, true),
            Origin::LocalFile(LOCAL_CONFIG.into())
        );
        assert_eq!(choose_origin(None, &none, false), Origin::Embedded);
        assert_eq!(
            choose_origin(None, &env_of(&[("LEGATE_CONFIG", "")]), false),
            Origin::Embedded
        );
    }

    /// A reload reads where the start read: a file gone missing is an error (the embedded
    /// default, with its public providers and no client keys, would replace the config).
    #[test]
    fn a_reload_reads_where_the_start_read() {
        let dir = std::env::temp_dir().join(format!("legate-load-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let file = dir.join("legate.toml");
        let _ = std::fs::write(&file, "[server]\nmax_body_bytes = 1234\n");
        let local = Origin::LocalFile(file.clone());
        let read = load_origin(&local, &env_of(&[]));
        assert_eq!(read.map(|c| c.server.max_body_bytes).ok(), Some(1234));
        let _ = std::fs::remove_file(&file);
        let gone = load_origin(&local, &env_of(&[]));
        assert!(
            gone.is_err_and(|e| e.0[0].message.starts_with("cannot read")),
            "a missing file is not the embedded default"
        );
        assert!(load_origin(&Origin::Embedded, &env_of(&[])).is_ok());
        let _ = std::fs::remove_dir(&dir);
    }

    #[test]
    fn log_filter_prefers_legate_log() {
        assert_eq!(log_filter_from(&env_of(&[])), "info");
        assert_eq!(log_filter_from(&env_of(&[("RUST_LOG", "debug")])), "debug");
        assert_eq!(
            log_filter_from(&env_of(&[
                ("RUST_LOG", "debug"),
                ("LEGATE_LOG", "legate=trace")
            ])),
            "legate=trace"
        );
        assert_eq!(
            log_filter_from(&env_of(&[("LEGATE_LOG", ""), ("RUST_LOG", "warn")])),
            "warn"
        );
    }

    #[test]
    fn explicit_path_is_read_and_a_missing_one_is_reported()
    -> Result<(), Box<dyn std::error::Error>> {
        let (dir, path) = temp_file("legate.toml", "[server]\nmax_body_bytes = 1234\n")?;
        let (cfg, origin) = load_with_env(Some(&path), &env_of(&[]))?;
        assert_eq!(cfg.server.max_body_bytes, 1234);
        assert_eq!(origin, Origin::Path(path.clone()));

        let (cfg, origin) = load_with_env(
            None,
            &env_of(&[("LEGATE_CONFIG", &path.display().to_string())]),
        )?;
        assert_eq!(cfg.server.max_body_bytes, 1234);
        assert_eq!(origin, Origin::Env(path));

        let missing = dir.path().join("absent.toml");
        let Err(errs) = load_with_env(Some(&missing), &env_of(&[])) else {
            return Err("a missing file loaded".into());
        };
        assert!(errs.has_path(&missing.display().to_string()));
        Ok(())
    }

    #[test]
    fn syntax_errors_name_the_file() -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, path) = temp_file("bad.toml", "[server\nlisten = 1\n")?;
        let Err(errs) = load_with_env(Some(&path), &env_of(&[])) else {
            return Err("bad TOML loaded".into());
        };
        assert!(errs.has_path(&path.display().to_string()), "{errs}");
        Ok(())
    }

    /// Every `*.toml` under the crate's `config/` directory, examples included.
    fn config_files() -> std::io::Result<Vec<PathBuf>> {
        let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("config")];
        let mut files = Vec::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir)? {
                let path = entry?.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "toml") {
                    files.push(path);
                }
            }
        }
        files.sort();
        Ok(files)
    }

    /// Examples name certificate and key files of the machine they were written for; point
    /// each at a temporary file through environment overrides so the rest is validated as is.
    fn stand_in_files(
        toml: &str,
        dir: &Path,
    ) -> Result<HashMap<String, String>, Box<dyn std::error::Error>> {
        let raw = config::Config::builder()
            .add_source(File::from_str(toml, FileFormat::Toml))
            .build()?;
        let mut overrides = HashMap::new();
        let Ok(providers) = raw.get_table("providers") else {
            return Ok(overrides);
        };
        // TLS files are read as the upstream client reads them: real PEM, a key that fits.
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
        let (cert_pem, key_pem) = (made.cert.pem(), made.signing_key.serialize_pem());
        for (name, table) in providers {
            let table = table.into_table()?;
            for key in [
                "api_key_file",
                "ca_file",
                "client_cert_file",
                "client_key_file",
            ] {
                if table.contains_key(key) {
                    let stand_in = dir.join(format!("{name}-{key}"));
                    let content = match key {
                        "ca_file" | "client_cert_file" => cert_pem.as_str(),
                        "client_key_file" => key_pem.as_str(),
                        _ => "stand-in\n",
                    };
                    std::fs::write(&stand_in, content)?;
                    overrides.insert(
                        format!(
                            "LEGATE__PROVIDERS__{}__{}",
                            name.to_uppercase(),
                            key.to_uppercase()
                        ),
                        stand_in.display().to_string(),
                    );
                }
            }
        }
        Ok(overrides)
    }

    #[test]
    fn every_file_in_the_config_directory_loads() -> Result<(), Box<dyn std::error::Error>> {
        let files = config_files()?;
        assert!(
            files.len() >= 6,
            "expected the default, offline and examples: {files:?}"
        );
        let dir = tempfile::tempdir()?;
        for path in files {
            let text = std::fs::read_to_string(&path)?;
            let overrides = stand_in_files(&text, dir.path())?;
            match load_with_env(Some(&path), &overrides) {
                Ok((cfg, _)) => assert!(!cfg.providers.is_empty()),
                Err(errs) => return Err(format!("{}:\n{errs}", path.display()).into()),
            }
        }
        Ok(())
    }

    #[test]
    fn the_embedded_default_is_the_shipped_file_and_loads() -> Result<(), Box<dyn std::error::Error>>
    {
        let shipped =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(LOCAL_CONFIG))?;
        assert_eq!(shipped, DEFAULT_TOML);
        let cfg = load_str(DEFAULT_TOML, &env_of(&[]))?;
        // It spells out the built-in defaults: apart from prices it is the empty config.
        let mut bare = load_str("", &env_of(&[]))?;
        bare.prices = cfg.prices.clone();
        assert_eq!(
            crate::config::render_masked(&bare),
            crate::config::render_masked(&cfg)
        );
        assert!(!cfg.prices.is_empty());
        Ok(())
    }
}
