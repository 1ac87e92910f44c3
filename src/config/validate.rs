//! Turns the merged configuration tree into a typed [`Config`], reporting every problem at
//! once, each with its key path. Each section has its own file; this one fixes which top-level
//! sections exist and the checks that span sections.

use std::collections::HashMap;

use config::Value;

use crate::config::{Config, ConfigErrors};
use reader::{Cx, Table};

mod admission;
mod clients;
mod cloud;
mod limits;
mod models;
mod observe;
mod policy;
mod prices;
mod providers;
mod reader;
mod server;
#[cfg(test)]
mod tests;

/// Validates a merged tree. `env` is where `api_key_env` variables are looked up.
pub fn validate(root: &Value, env: &HashMap<String, String>) -> Result<Config, ConfigErrors> {
    let mut cx = Cx::new(env);
    let Some(mut top) = Table::of(root, "", &mut cx) else {
        return Err(ConfigErrors(cx.into_errors()));
    };
    // An absent section reads as empty (all defaults); a non-table is reported.
    let server = top
        .table(&mut cx, "server")
        .map(|t| server::parse(t, &mut cx));
    let providers = match top.table(&mut cx, "providers") {
        Some(t) => providers::parse(t, &mut cx),
        None => providers::parse(Table::absent("providers"), &mut cx),
    };
    let (items, path) = top.array(&mut cx, "models");
    let models = models::parse_models(items, &path, &providers, &mut cx);
    let routing = top
        .table(&mut cx, "routing")
        .map(|t| models::parse_routing(t, &providers, &mut cx));
    let (items, path) = top.array(&mut cx, "clients");
    let clients = clients::parse(items, &path, &mut cx);
    let (items, path) = top.array(&mut cx, "prices");
    let prices = prices::parse(items, &path, &mut cx);
    let (items, path) = top.array(&mut cx, "limits");
    let limits = limits::parse(items, &path, &mut cx);
    let retry = match top.table(&mut cx, "retry") {
        Some(t) => policy::parse_retry(t, &mut cx),
        None => Default::default(),
    };
    let breaker = match top.table(&mut cx, "breaker") {
        Some(t) => policy::parse_breaker(t, &mut cx),
        None => Default::default(),
    };
    let tenants = match top.table(&mut cx, "tenants") {
        Some(t) => admission::parse_tenants(t, &mut cx),
        None => admission::parse_tenants(Table::absent("tenants"), &mut cx),
    };
    let ratelimit = match top.table(&mut cx, "ratelimit") {
        Some(t) => admission::parse_ratelimit(t, &mut cx),
        None => Default::default(),
    };
    let shedding = match top.table(&mut cx, "shedding") {
        Some(t) => admission::parse_shedding(t, &mut cx),
        None => Default::default(),
    };
    let responses = match top.table(&mut cx, "responses") {
        Some(t) => admission::parse_responses(t, &mut cx),
        None => Default::default(),
    };
    if responses.store == crate::config::StoreKind::Redis && ratelimit.redis_url.is_none() {
        cx.err(
            "responses.store",
            "store = \"redis\" needs ratelimit.redis_url (e.g. \"redis://127.0.0.1:6379/0\")",
        );
    }
    let (log, telemetry) = (top.table(&mut cx, "log"), top.table(&mut cx, "telemetry"));
    let journal = top.table(&mut cx, "journal");
    let observe = observe::parse(log, telemetry, journal, &mut cx);
    top.finish(&mut cx);

    if let Some(server) = &server {
        // Without client keys anyone who can reach the port spends the provider keys.
        if !crate::loopback::is_loopback_ip(server.listen.ip()) && clients.is_empty() {
            cx.err(
                "server.listen",
                format!(
                    "`{}` is reachable from other hosts; configure [[clients]] keys or listen \
                     on a loopback address such as 127.0.0.1",
                    server.listen
                ),
            );
        }
    }

    let errors = cx.into_errors();
    match (server, routing) {
        (Some(server), Some(routing)) if errors.is_empty() => Ok(Config {
            server,
            providers: providers.configs,
            models,
            routing,
            clients,
            prices,
            limits,
            retry,
            breaker,
            tenants,
            ratelimit,
            shedding,
            responses,
            observe,
        }),
        _ => Err(ConfigErrors(errors)),
    }
}
