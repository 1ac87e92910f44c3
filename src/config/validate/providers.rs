//! `[providers.NAME]`: where each upstream is, how legate authenticates and connects to it.

use std::collections::BTreeMap;
use std::path::Path;

use super::{Cx, cloud};
use crate::config::adapt::mask_userinfo;
use crate::config::cloud::Platform;
use crate::config::file::{ProviderFile, ProviderKind};
use crate::config::shown::shown;
use crate::config::{ApiKind, AuthHeader, KeySource, ProviderConfig};

/// What other sections need to know about the providers, including those whose own entry had
/// errors (so a typo in one provider does not also flag every chain that names it).
pub(crate) struct Providers {
    pub configs: BTreeMap<String, ProviderConfig>,
    /// Every declared provider; `None` when its kind is unknown (no kind checks against it).
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

pub(crate) fn build(files: &BTreeMap<String, ProviderFile>, cx: &mut Cx) -> Providers {
    let mut out = Providers {
        configs: BTreeMap::new(),
        kinds: BTreeMap::new(),
    };
    if files.is_empty() {
        // An empty `[providers]` table replaces the defaults with nothing: every request
        // would be a 404.
        cx.err(
            "providers",
            "no provider is configured; name at least one ([providers.NAME] with a kind), or leave [providers] out for the defaults",
        );
    }
    for (name, p) in files {
        let at = format!("providers.{name}");
        if !super::is_ident(name) {
            cx.err(
                &at,
                format!(
                    "provider name `{}` is not a lowercase identifier ([a-z0-9_-]+)",
                    shown(name)
                ),
            );
        }
        let kind = declared_kind(name, p, &at, cx);
        out.kinds.insert(name.clone(), kind.map(api_of));
        if let Some(config) = kind.and_then(|k| provider(name, k, p, &at, cx)) {
            out.configs.insert(name.clone(), config);
        }
    }
    out
}

/// The wire API the caller's request is in when it reaches a provider of this kind.
pub(crate) fn api_of(kind: ProviderKind) -> ApiKind {
    match kind {
        ProviderKind::Anthropic | ProviderKind::Bedrock | ProviderKind::Vertex => {
            ApiKind::Anthropic
        }
        ProviderKind::Openai | ProviderKind::AzureOpenai => ApiKind::OpenAi,
    }
}

/// The two well-known providers may leave out `kind`: their name says it.
fn declared_kind(name: &str, p: &ProviderFile, at: &str, cx: &mut Cx) -> Option<ProviderKind> {
    let implied = match name {
        "anthropic" => Some(ProviderKind::Anthropic),
        "openai" => Some(ProviderKind::Openai),
        _ => None,
    };
    let kind = p.kind.or(implied);
    cx.required(kind, &format!("{at}.kind"))
}

fn default_base_url(kind: ApiKind) -> &'static str {
    match kind {
        ApiKind::Anthropic => "https://api.anthropic.com",
        // The Responses API is never a provider's kind: its `openai` provider says it serves it.
        ApiKind::OpenAi | ApiKind::Responses => "https://api.openai.com",
    }
}

fn provider(
    name: &str,
    kind: ProviderKind,
    p: &ProviderFile,
    at: &str,
    cx: &mut Cx,
) -> Option<ProviderConfig> {
    let api = api_of(kind);
    let base_url = p.base_url.as_deref().and_then(|u| {
        normalize_base_url(u)
            .map_err(|m| cx.err(&format!("{at}.base_url"), m))
            .ok()
    });
    let key = key_source(p, at, cx);
    let mut files_exist = true;
    for (key_name, file) in [
        ("ca_file", &p.ca_file),
        ("client_cert_file", &p.client_cert_file),
        ("client_key_file", &p.client_key_file),
    ] {
        if let Some(file) = file {
            files_exist &= existing_file(file, &format!("{at}.{key_name}"), cx);
        }
    }
    if files_exist {
        // Read as the upstream client reads them at start: what it would refuse is refused.
        let client = match (&p.client_cert_file, &p.client_key_file) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            _ => None,
        };
        for (key_name, problem) in crate::config::tls::problems(p.ca_file.as_deref(), client) {
            cx.err(&format!("{at}.{key_name}"), problem);
        }
    }
    // A client certificate is useless without its key and the other way round.
    match (&p.client_cert_file, &p.client_key_file) {
        (Some(_), None) => cx.err(
            &format!("{at}.client_cert_file"),
            "client_cert_file needs client_key_file as well",
        ),
        (None, Some(_)) => cx.err(
            &format!("{at}.client_key_file"),
            "client_key_file needs client_cert_file as well",
        ),
        _ => {}
    }
    if p.responses.is_some() && api != ApiKind::OpenAi {
        cx.err(
            &format!("{at}.responses"),
            "only a provider of an OpenAI kind serves the Responses API",
        );
    }
    let platform = cloud::platform(kind, p, &key, at, cx)?;
    let default_auth = match platform {
        Platform::AzureOpenAi(_) => AuthHeader::ApiKey,
        _ if api == ApiKind::Anthropic => AuthHeader::XApiKey,
        _ => AuthHeader::Bearer,
    };
    let base_url = base_url
        .or_else(|| cloud::default_base_url(&platform))
        .unwrap_or_else(|| default_base_url(api).to_owned());
    Some(ProviderConfig {
        name: name.to_owned(),
        kind: api,
        platform,
        base_url,
        key,
        auth_header: p.auth_header.unwrap_or(default_auth),
        connect_timeout: p.connect_timeout,
        first_byte_timeout: p.first_byte_timeout,
        idle_timeout: p.idle_timeout,
        pool_idle_timeout: p.pool_idle_timeout,
        max_concurrency: p.max_concurrency.get(),
        tls_roots: p.tls_roots,
        ca_file: p.ca_file.clone(),
        client_cert_file: p.client_cert_file.clone(),
        client_key_file: p.client_key_file.clone(),
        responses: p.responses.unwrap_or(true),
    })
}

/// `api_key_env` or `api_key_file`, never both. An unset variable is not an error (legate must
/// start on a machine without keys); a missing, empty or garbled file is.
fn key_source(p: &ProviderFile, at: &str, cx: &mut Cx) -> KeySource {
    match (&p.api_key_env, &p.api_key_file) {
        (Some(_), Some(_)) => {
            cx.err(
                &format!("{at}.api_key_file"),
                "set either api_key_env or api_key_file, not both",
            );
            KeySource::None
        }
        (Some(var), None) => {
            if !is_env_var_name(var) {
                // Never quoted: the commonest mistake here is the key itself.
                cx.err(
                    &format!("{at}.api_key_env"),
                    "not an environment variable name ([A-Za-z_][A-Za-z0-9_]*); name the \
                     variable that holds the key, not the key",
                );
                return KeySource::None;
            }
            // Read as a key file is: a Secret mounted as an environment variable often keeps
            // its trailing newline, which no header can carry.
            let value = match cx.env.get(var).filter(|v| !v.is_empty()) {
                None => None,
                Some(v) => match crate::config::secret::parse_key(v.clone()) {
                    Ok(key) => Some(key),
                    Err(e) => {
                        // Names the variable, never its value.
                        cx.err(&format!("{at}.api_key_env"), format!("${var}: {e}"));
                        return KeySource::None;
                    }
                },
            };
            KeySource::Env {
                var: var.clone(),
                value,
            }
        }
        (None, Some(file)) => {
            let path = format!("{at}.api_key_file");
            if !existing_file(file, &path, cx) {
                return KeySource::None;
            }
            if let Err(m) = crate::config::secret::check_key_file(file) {
                cx.err(&path, format!("`{}`: {m}", file.display()));
                return KeySource::None;
            }
            KeySource::File { path: file.clone() }
        }
        (None, None) => KeySource::None,
    }
}

fn is_env_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A path that must name an existing regular file now, so that a typo fails `legate check`
/// rather than the first request.
pub(crate) fn existing_file(file: &Path, path: &str, cx: &mut Cx) -> bool {
    let written = file.to_string_lossy();
    // Only a message shows it: the key patterns are not compiled for a config that is fine.
    let shown = || crate::config::shown::shown(&written).into_owned();
    let problem = match std::fs::metadata(file) {
        Ok(meta) if meta.is_file() => return true,
        _ if file.as_os_str().is_empty() => "must not be empty".to_owned(),
        Ok(_) => format!("`{}` is not a regular file", shown()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            format!("file `{}` does not exist", shown())
        }
        Err(e) => format!("cannot read `{}`: {e}", shown()),
    };
    cx.err(path, problem);
    false
}

/// `http(s)://authority[/prefix]` with no query, fragment or credentials; trailing slashes are
/// removed so request paths can be appended verbatim. Messages show a URL only with its
/// userinfo masked, and an unparseable one not at all.
pub(crate) fn normalize_base_url(s: &str) -> Result<String, String> {
    // Only a message shows it: the key patterns are not compiled for a URL that is fine.
    let shown = || crate::config::shown::shown(&mask_userinfo(s)).into_owned();
    if s.contains('#') || s.contains('?') {
        return Err(format!(
            "`{}` must not contain a query or fragment",
            shown()
        ));
    }
    let uri: http::Uri = s
        .parse()
        .map_err(|_| "not a valid URL (expected http://host[:port][/prefix])".to_owned())?;
    let scheme = uri.scheme_str().map(str::to_ascii_lowercase);
    let scheme = match scheme.as_deref() {
        Some(sc @ ("http" | "https")) => sc.to_owned(),
        _ => return Err(format!("`{}` must start with http:// or https://", shown())),
    };
    let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
        return Err(format!("`{}` has no host", shown()));
    };
    if authority.as_str().contains('@') {
        return Err(format!(
            "`{}` must not carry credentials; use api_key_env or api_key_file",
            shown()
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
        for (given, normal) in [
            ("https://api.anthropic.com/", "https://api.anthropic.com"),
            ("HTTP://127.0.0.1:8790", "http://127.0.0.1:8790"),
            ("http://[::1]:11434/v1//", "http://[::1]:11434/v1"),
            (
                "https://gw.example/openai/v1",
                "https://gw.example/openai/v1",
            ),
        ] {
            assert_eq!(normalize_base_url(given).as_deref(), Ok(normal), "{given}");
        }
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
        assert_eq!(
            normalize_base_url("https://user:sk-CANARY@x.example").err(),
            Some(
                "`https://***@x.example` must not carry credentials; use api_key_env or \
                 api_key_file"
                    .to_owned()
            )
        );
    }
}
