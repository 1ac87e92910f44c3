//! Turns the file as read ([`FileConfig`]) into the runtime [`Config`]: the checks that one
//! key's type cannot express (names, URLs, files, references between sections, contradictions),
//! each reported at its key path, all of them at once. Each section has its own file; this one
//! puts them together and holds the checks that span sections.

use std::collections::{BTreeMap, HashMap};

use crate::config::file::FileConfig;
use crate::config::{Config, ConfigError, ConfigErrors};

mod admission;
mod clients;
mod cloud;
mod limits;
mod models;
mod observe;
mod policy;
mod prices;
mod providers;
mod server;
#[cfg(test)]
mod tests;

/// Accumulates problems, and carries the environment that key variables are read from.
pub(crate) struct Cx<'e> {
    errors: Vec<ConfigError>,
    /// Paths whose value could not be read: problems at or below them would repeat that one.
    failed: Vec<String>,
    pub env: &'e HashMap<String, String>,
}

impl<'e> Cx<'e> {
    pub(crate) fn new(
        errors: Vec<ConfigError>,
        failed: Vec<String>,
        env: &'e HashMap<String, String>,
    ) -> Self {
        Self {
            errors,
            failed,
            env,
        }
    }

    pub(crate) fn err(&mut self, path: &str, message: impl Into<String>) {
        let under = |f: &String| {
            path.strip_prefix(f.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        };
        if !self.failed.iter().any(under) {
            // A table's name is part of the path (`providers.<name>`): one that looks like a
            // key, pasted where a name goes, is not printed back there either.
            let shown_path = path
                .split('.')
                .map(crate::config::shown::shown)
                .collect::<Vec<_>>()
                .join(".");
            self.errors.push(ConfigError::new(shown_path, message));
        }
    }

    /// Reports a key that must be present; `None` stays `None`.
    pub(crate) fn required<T>(&mut self, value: Option<T>, path: &str) -> Option<T> {
        if value.is_none() {
            self.err(path, "missing required key");
        }
        value
    }

    pub(crate) fn into_errors(self) -> Vec<ConfigError> {
        self.errors
    }
}

/// For a list whose entries must not repeat a key: records that `key` is at index `i` and
/// returns None, or, when it was seen before, the index of its first entry.
pub(crate) fn repeat_of<K: Ord>(
    first_seen: &mut BTreeMap<K, usize>,
    key: K,
    i: usize,
) -> Option<usize> {
    match first_seen.entry(key) {
        std::collections::btree_map::Entry::Occupied(e) => Some(*e.get()),
        std::collections::btree_map::Entry::Vacant(e) => {
            e.insert(i);
            None
        }
    }
}

/// Lowercase identifiers, as provider and tenant names must be: `[a-z0-9_-]+`.
pub(crate) fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Splits a `provider:model` target at the first colon (model names may contain colons, as
/// Ollama's `llama3:8b` does).
pub(crate) fn split_target(s: &str) -> Result<(&str, &str), String> {
    match s.split_once(':') {
        Some((provider, model)) if !provider.is_empty() && !model.trim().is_empty() => {
            Ok((provider, model))
        }
        _ => Err("not of the form \"provider:model\"".to_owned()),
    }
}

/// Validates the file as read. `read` holds the problems met while reading it and the paths
/// that could not be read; `env` is where `api_key_env` variables are looked up.
pub fn validate(
    file: FileConfig,
    read: (Vec<ConfigError>, Vec<String>),
    env: &HashMap<String, String>,
) -> Result<Config, ConfigErrors> {
    let mut cx = Cx::new(read.0, read.1, env);
    let server = server::build(&file.server, &mut cx);
    let providers = providers::build(&file.providers, &mut cx);
    let models = models::build_models(&file.models, &providers, &mut cx);
    let routing = models::build_routing(&file.routing, &providers, &mut cx);
    let clients = clients::build(&file.clients, &mut cx);
    let prices = prices::build(&file.prices, &mut cx);
    let limits = limits::build(&file.limits, &mut cx);
    policy::check(&file.retry, &file.breaker, &mut cx);
    let tenants = admission::tenants(file.tenants, &mut cx);
    admission::check_ratelimit(&file.ratelimit, &mut cx);
    if file.responses.store == crate::config::StoreKind::Redis && file.ratelimit.redis_url.is_none()
    {
        cx.err(
            "responses.store",
            "store = \"redis\" needs ratelimit.redis_url (e.g. \"redis://127.0.0.1:6379/0\")",
        );
    }
    let observe = observe::build(file.log, &file.telemetry, file.journal, &mut cx);

    // Without client keys anyone who can reach the port spends the provider keys.
    if !crate::loopback::is_loopback_ip(server.listen.ip()) && clients.is_empty() {
        cx.err(
            "server.listen",
            format!(
                "`{}` is reachable from other hosts; configure [[clients]] keys or listen on \
                 a loopback address such as 127.0.0.1",
                server.listen
            ),
        );
    }

    let errors = cx.into_errors();
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    Ok(Config {
        server,
        providers: providers.configs,
        models,
        routing,
        clients,
        prices,
        limits,
        retry: file.retry,
        breaker: file.breaker,
        tenants,
        ratelimit: file.ratelimit,
        shedding: file.shedding,
        responses: file.responses,
        observe,
    })
}
