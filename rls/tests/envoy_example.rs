//! examples/envoy: the descriptors that envoy.yaml's rate limit actions
//! build are the ones ratelimit/config.yaml limits. No Envoy binary runs
//! here, so the actions are read from the file and turned into the
//! descriptors Envoy would send, then planned as tb-rls plans them.

use saphyr::{LoadableYamlNode, Yaml};
use std::path::PathBuf;
use tb_rls::config::Config;
use tb_rls::plan::{plan, Decision, Descriptor, Request};
use tb_rls::unit::Unit;

fn example(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/envoy")
        .join(file)
}

/// One action: its descriptor key, the header its value comes from, and
/// a generic_key's fixed value.
type Action = (String, Option<String>, Option<String>);

/// What the test reads of envoy.yaml: the ratelimit filter's domain, and
/// each `rate_limits` entry of its routes as its actions, in order.
struct Envoy {
    domain: String,
    limits: Vec<Vec<Action>>,
}

fn list<'b, 'a>(node: &'b Yaml<'a>) -> &'b [Yaml<'a>] {
    node.as_vec().map(Vec::as_slice).unwrap_or_default()
}

fn text(node: &Yaml, field: &str) -> Option<String> {
    node.as_mapping_get(field)
        .and_then(Yaml::as_str)
        .map(str::to_string)
}

fn action(a: &Yaml) -> Action {
    match a.as_mapping_get("request_headers") {
        Some(h) => (
            text(h, "descriptor_key").unwrap(),
            text(h, "header_name"),
            None,
        ),
        None => {
            let g = a.as_mapping_get("generic_key").unwrap();
            let key = text(g, "descriptor_key").unwrap_or_else(|| "generic_key".into());
            (key, None, text(g, "descriptor_value"))
        }
    }
}

fn envoy() -> Envoy {
    let docs =
        Yaml::load_from_str(&std::fs::read_to_string(example("envoy.yaml")).unwrap()).unwrap();
    let filters: Vec<&Yaml> = list(&docs[0]["static_resources"]["listeners"])
        .iter()
        .flat_map(|l| list(&l["filter_chains"]))
        .flat_map(|c| list(&c["filters"]))
        .collect();
    let domain = filters
        .iter()
        .flat_map(|f| list(&f["typed_config"]["http_filters"]))
        .find_map(|h| text(&h["typed_config"], "domain"))
        .unwrap();
    let limits = filters
        .iter()
        .flat_map(|f| list(&f["typed_config"]["route_config"]["virtual_hosts"]))
        .flat_map(|h| list(&h["routes"]))
        .flat_map(|r| list(&r["route"]["rate_limits"]))
        .map(|l| list(&l["actions"]).iter().map(action).collect())
        .collect();
    Envoy { domain, limits }
}

/// The limit each descriptor of one request meets, as (name, requests per unit, unit).
fn limits(
    envoy: &Envoy,
    config: &Config,
    headers: &[(&str, &str)],
) -> Vec<Option<(String, u32, Unit)>> {
    let descriptors: Vec<Descriptor> = envoy
        .limits
        .iter()
        .cloned()
        .filter_map(|keys| {
            // Envoy drops a descriptor one of whose headers is absent.
            let entries: Option<Vec<(String, String)>> = keys
                .into_iter()
                .map(|(key, header, fixed)| match (header, fixed) {
                    (Some(h), _) => headers
                        .iter()
                        .find(|(n, _)| *n == h)
                        .map(|(_, v)| (key, v.to_string())),
                    (None, value) => value.map(|v| (key, v)),
                })
                .collect();
            entries.map(|entries| Descriptor {
                entries,
                ..Descriptor::default()
            })
        })
        .collect();
    let request = Request {
        domain: envoy.domain.clone(),
        descriptors,
        hits_addend: 1,
    };
    plan(config, &request)
        .unwrap()
        .decisions
        .into_iter()
        .map(|d| match d {
            Decision::Enforced { limit, .. } => {
                Some((limit.name, limit.requests_per_unit, limit.unit))
            }
            _ => None,
        })
        .collect()
}

fn limit(name: &str, per_unit: u32, unit: Unit) -> Option<(String, u32, Unit)> {
    Some((name.to_string(), per_unit, unit))
}

#[test]
fn every_descriptor_of_envoys_actions_meets_its_limit() {
    let config = Config::load(&example("ratelimit/config.yaml")).unwrap();
    let envoy = envoy();
    let free = [
        limit("user", 20, Unit::Minute),
        limit("key", 1, Unit::Second),
        limit("model", 300, Unit::Minute),
        limit("deployment", 200, Unit::Second),
    ];
    let caller = |tier: &'static str, model: &'static str| {
        [
            ("x-tier", tier),
            ("x-user-id", "u1"),
            ("x-api-key-id", "k1"),
            ("x-model", model),
        ]
    };
    assert_eq!(
        limits(&envoy, &config, &caller("free", "gpt-4o-mini")),
        free
    );
    assert_eq!(
        limits(&envoy, &config, &caller("pro", "llama-3-8b")),
        [
            limit("user", 600, Unit::Minute),
            limit("key", 20, Unit::Second),
            limit("model", 1200, Unit::Minute),
            limit("deployment", 200, Unit::Second),
        ]
    );
    // A tier the file doesn't name gets the free tier's limits, not none.
    assert_eq!(limits(&envoy, &config, &caller("gold", "gpt-4o")), free);
    // Without the token's headers (jwt_authn refuses such a request first),
    // only the deployment's cap would apply: why the identities must come
    // from the verified token.
    assert_eq!(
        limits(&envoy, &config, &[]),
        [limit("deployment", 200, Unit::Second)]
    );
}
