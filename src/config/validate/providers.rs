//! `[providers.NAME]`: where each upstream is, how legate authenticates and connects to it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use config::Value;

use super::cloud::{self, Declared};
use super::reader::{self, Cx, Table};
use crate::config::cloud::Platform;
use crate::config::{ApiKind, AuthHeader, KeySource, ProviderConfig, Secret, TlsRoots};

const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_MAX_CONCURRENCY: usize = 256;

/// What other sections need to know about the providers, including those whose own entry had
/// errors (so a typo in one provider does not also flag every chain that names it).
pub(crate) struct Providers {
    pub configs: BTreeMap<String, ProviderConfig>,
    /// Every declared provider; `None` when its kind is invalid (no kind checks against it).
    pub kinds: BTreeMap<String, Option<ApiKind>>,
}

impl Providers {
    /// The declared names, for "unknown provider" messages.
    pub(super) fn names(&self) -> String {
        let names: Vec<&str> = self.kinds.keys().map(String::as_str).collect();
        if names.is_empty() {
            "none are configured".to_owned()
        } else {
            format!("configured: {}", names.join(", "))
        }
    }
}

pub(crate) fn parse(t: Table, cx: &mut Cx) -> Providers {
    let mut out = Providers {
        configs: BTreeMap::new(),
        kinds: BTreeMap::new(),
    };
    let mut t = t;
    for name in t.keys() {
        let Some((value, path)) = t.get(name) else {
            continue;
        };
        if !reader::is_ident(name) {
            cx.err(
                &path,
                format!("provider name `{name}` is not a lowercase identifier ([a-z0-9_-]+)"),
            );
        }
        let Some(table) = Table::of(value, &path, cx) else {
            out.kinds.insert(name.to_owned(), None);
            continue;
        };
        let (kind, config) = provider(name, table, cx);
        out.kinds.insert(name.to_owned(), kind);
        if let Some(config) = config {
            out.configs.insert(name.to_owned(), config);
        }
    }
    t.finish(cx);
    out
}

fn auth_header(v: &Value, path: &str, cx: &mut Cx) -> Option<AuthHeader> {
    match reader::string(v, path, cx)?.as_str() {
        "x-api-key" => Some(AuthHeader::XApiKey),
        "bearer" => Some(AuthHeader::Bearer),
        "api-key" => Some(AuthHeader::ApiKey),
        other => {
            cx.err(
                path,
                format!("`{other}` is not x-api-key, bearer or api-key"),
            );
            None
        }
    }
}

fn tls_roots(v: &Value, path: &str, cx: &mut Cx) -> Option<TlsRoots> {
    match reader::string(v, path, cx)?.as_str() {
        "webpki" => Some(TlsRoots::Webpki),
        "native" => Some(TlsRoots::Native),
        other => {
            cx.err(path, format!("`{other}` is not webpki or native"));
            None
        }
    }
}

fn default_base_url(kind: ApiKind) -> &'static str {
    match kind {
        ApiKind::Anthropic => "https://api.anthropic.com",
        // The Responses API is never a provider's kind: its `openai` provider says it serves it.
        ApiKind::OpenAi | ApiKind::Responses => "https://api.openai.com",
    }
}

fn default_auth_header(kind: ApiKind) -> AuthHeader {
    match kind {
        ApiKind::Anthropic => AuthHeader::XApiKey,
        ApiKind::OpenAi | ApiKind::Responses => AuthHeader::Bearer,
    }
}

/// Reads one provider. The kind is returned even when other keys are wrong, so that chains
/// naming this provider are still checked against it.
fn provider(name: &str, mut t: Table, cx: &mut Cx) -> (Option<ApiKind>, Option<ProviderConfig>) {
    // The two well-known providers may leave out `kind`: their name says it.
    let implied = match name {
        "anthropic" => Some(Declared::Direct(ApiKind::Anthropic)),
        "openai" => Some(Declared::Direct(ApiKind::OpenAi)),
        _ => None,
    };
    let declared = match implied {
        Some(k) => t.opt(cx, "kind", cloud::kind).or(Some(k)),
        None => t.req(cx, "kind", cloud::kind),
    };
    let kind = declared.map(Declared::api);
    let base_url = t.opt(cx, "base_url", base_url);
    let key = key_source(&mut t, cx);
    let auth_header = t.opt(cx, "auth_header", auth_header);
    let connect_timeout = t.opt(cx, "connect_timeout", reader::positive_duration);
    let first_byte_timeout = t.opt(cx, "first_byte_timeout", reader::positive_duration);
    let idle_timeout = t.opt(cx, "idle_timeout", reader::positive_duration);
    let pool_idle_timeout = t.opt(cx, "pool_idle_timeout", reader::positive_duration);
    let max_concurrency = t.opt(cx, "max_concurrency", reader::positive_usize);
    let tls_roots = t.opt(cx, "tls_roots", tls_roots);
    let ca_file = t.opt(cx, "ca_file", existing_file);
    let client_cert_file = t.opt(cx, "client_cert_file", existing_file);
    let client_key_file = t.opt(cx, "client_key_file", existing_file);
    let responses = t.opt(cx, "responses", reader::boolean);
    client_identity_pair(&mut t, cx);
    let platform = cloud::platform(declared, &mut t, &key, cx);
    t.finish(cx);

    let (Some(kind), Some(platform)) = (kind, platform) else {
        return (kind, None);
    };
    let default_auth = match platform {
        Platform::AzureOpenAi(_) => AuthHeader::ApiKey,
        _ => default_auth_header(kind),
    };
    let base_url = base_url
        .or_else(|| cloud::default_base_url(&platform))
        .unwrap_or_else(|| default_base_url(kind).to_owned());
    let config = ProviderConfig {
        name: name.to_owned(),
        kind,
        platform,
        base_url,
        key,
        auth_header: auth_header.unwrap_or(default_auth),
        connect_timeout: connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        first_byte_timeout: first_byte_timeout.unwrap_or(DEFAULT_FIRST_BYTE_TIMEOUT),
        idle_timeout: idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT),
        pool_idle_timeout: pool_idle_timeout.unwrap_or(DEFAULT_POOL_IDLE_TIMEOUT),
        max_concurrency: max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY),
        tls_roots: tls_roots.unwrap_or(TlsRoots::Webpki),
        ca_file,
        client_cert_file,
        client_key_file,
        responses: responses.unwrap_or(true),
    };
    (Some(kind), Some(config))
}

/// `api_key_env` or `api_key_file`, never both. An unset variable is not an error (legate must
/// start on a machine without keys); a missing file is.
fn key_source(t: &mut Table, cx: &mut Cx) -> KeySource {
    let var = t.opt(cx, "api_key_env", env_var_name);
    let file = t.get("api_key_file");
    if let (Some(_), Some((_, path))) = (&var, &file) {
        cx.err(path, "set either api_key_env or api_key_file, not both");
        return KeySource::None;
    }
    if let Some(var) = var {
        let value = cx
            .env
            .get(&var)
            .filter(|v| !v.is_empty())
            .map(|v| Secret::new(v.clone()));
        return KeySource::Env { var, value };
    }
    match file.and_then(|(v, path)| existing_file(v, &path, cx)) {
        Some(path) => KeySource::File { path },
        None => KeySource::None,
    }
}

fn env_var_name(v: &Value, path: &str, cx: &mut Cx) -> Option<String> {
    let name = reader::non_empty_string(v, path, cx)?;
    if name.contains(['=', '\0']) || name.chars().any(char::is_whitespace) {
        cx.err(
            path,
            format!("`{name}` is not a valid environment variable name"),
        );
        return None;
    }
    Some(name)
}

/// A client certificate is useless without its key and the other way round.
fn client_identity_pair(t: &mut Table, cx: &mut Cx) {
    let cert = t.get("client_cert_file").map(|(_, p)| p);
    let key = t.get("client_key_file").map(|(_, p)| p);
    match (cert, key) {
        (Some(path), None) => cx.err(&path, "client_cert_file needs client_key_file as well"),
        (None, Some(path)) => cx.err(&path, "client_key_file needs client_cert_file as well"),
        _ => {}
    }
}

/// A path that must name an existing regular file now, so that a typo fails `legate check`
/// rather than the first request.
fn existing_file(v: &Value, path: &str, cx: &mut Cx) -> Option<PathBuf> {
    let s = reader::non_empty_string(v, path, cx)?;
    let file = PathBuf::from(&s);
    match std::fs::metadata(&file) {
        Ok(meta) if meta.is_file() => Some(file),
        Ok(_) => {
            cx.err(path, format!("`{s}` is not a regular file"));
            None
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            cx.err(path, format!("file `{s}` does not exist"));
            None
        }
        Err(e) => {
            cx.err(path, format!("cannot read `{s}`: {e}"));
            None
        }
    }
}

fn base_url(v: &Value, path: &str, cx: &mut Cx) -> Option<String> {
    let s = reader::string(v, path, cx)?;
    normalize_base_url(&s).map_err(|m| cx.err(path, m)).ok()
}

/// `http(s)://authority[/prefix]` with no query, fragment or credentials; trailing slashes are
/// removed so request paths can be appended verbatim.
pub(crate) fn normalize_base_url(s: &str) -> Result<String, String> {
    if s.contains('#') || s.contains('?') {
        return Err(format!("`{s}` must not contain a query or fragment"));
    }
    let uri: http::Uri = s
        .parse()
        .map_err(|e| format!("`{s}` is not a valid URL ({e})"))?;
    let scheme = uri.scheme_str().map(str::to_ascii_lowercase);
    let scheme = match scheme.as_deref() {
        Some(sc @ ("http" | "https")) => sc.to_owned(),
        _ => return Err(format!("`{s}` must start with http:// or https://")),
    };
    let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
        return Err(format!("`{s}` has no host"));
    };
    if authority.as_str().contains('@') {
        return Err(format!(
            "`{s}` must not carry credentials; use api_key_env or api_key_file"
        ));
    }
    let prefix = uri.path().trim_end_matches('/');
    Ok(format!("{scheme}://{authority}{prefix}"))
}

#[cfg(test)]
mod tests {
    use super::normalize_base_url;

    #[test]
    fn base_urls_are_normalised_or_refused() {
        let ok = |s: &str| normalize_base_url(s).ok();
        assert_eq!(
            ok("https://api.anthropic.com/").as_deref(),
            Some("https://api.anthropic.com")
        );
        assert_eq!(
            ok("HTTP://127.0.0.1:8790").as_deref(),
            Some("http://127.0.0.1:8790")
        );
        assert_eq!(
            ok("http://[::1]:11434/v1//").as_deref(),
            Some("http://[::1]:11434/v1")
        );
        assert_eq!(
            ok("https://gw.example/openai/v1").as_deref(),
            Some("https://gw.example/openai/v1")
        );
        for bad in [
            "ftp://x.example",
            "api.openai.com",
            "https://x.example/?a=1",
            "https://x.example/#top",
            "https://user:pw@x.example",
            "https://",
            "",
            "https://x .example",
        ] {
            assert!(normalize_base_url(bad).is_err(), "{bad} accepted");
        }
    }
}
