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

/// Each `rate_limits` entry of envoy.yaml's routes: its descriptor keys,
/// in order, and the header each one comes from (None: a generic_key,
/// whose value is fixed).
fn actions() -> Vec<Vec<Action>> {
    let text = std::fs::read_to_string(example("envoy.yaml")).unwrap();
    let docs = Yaml::load_from_str(&text).unwrap();
    let mut out = Vec::new();
    let listeners = docs[0]["static_resources"]["listeners"].as_vec().unwrap();
    for listener in listeners {
        for chain in listener["filter_chains"].as_vec().unwrap() {
            for filter in chain["filters"].as_vec().unwrap() {
                let hosts = &filter["typed_config"]["route_config"]["virtual_hosts"];
                for host in hosts.as_vec().unwrap() {
                    for route in host["routes"].as_vec().unwrap() {
                        let limits = route["route"]["rate_limits"].as_vec().unwrap();
                        for limit in limits {
                            let mut keys = Vec::new();
                            for action in limit["actions"].as_vec().unwrap() {
                                let text = |node: &Yaml, field: &str| {
                                    node.as_mapping_get(field)
                                        .and_then(Yaml::as_str)
                                        .map(str::to_string)
                                };
                                if let Some(h) = action.as_mapping_get("request_headers") {
                                    let key = text(h, "descriptor_key").unwrap();
                                    keys.push((key, text(h, "header_name"), None));
                                } else {
                                    let g = action.as_mapping_get("generic_key").unwrap();
                                    let key = text(g, "descriptor_key")
                                        .unwrap_or_else(|| "generic_key".into());
                                    keys.push((key, None, text(g, "descriptor_value")));
                                }
                            }
                            out.push(keys);
                        }
                    }
                }
            }
        }
    }
    out
}

fn domain() -> String {
    let text = std::fs::read_to_string(example("envoy.yaml")).unwrap();
    let (_, rest) = text.split_once("domain: ").unwrap();
    rest.lines().next().unwrap().trim().to_string()
}

/// The limit each descriptor of one request meets, as (name, requests per unit, unit).
fn limits(config: &Config, headers: &[(&str, &str)]) -> Vec<Option<(String, u32, Unit)>> {
    let descriptors: Vec<Descriptor> = actions()
        .into_iter()
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
        domain: domain(),
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
    let caller = |tier: &'static str, model: &'static str| {
        [
            ("x-tier", tier),
            ("x-user-id", "u1"),
            ("x-api-key-id", "k1"),
            ("x-model", model),
        ]
    };
    assert_eq!(
        limits(&config, &caller("free", "gpt-4o-mini")),
        [
            limit("user", 20, Unit::Minute),
            limit("key", 1, Unit::Second),
            limit("model", 300, Unit::Minute),
            limit("deployment", 200, Unit::Second),
        ]
    );
    assert_eq!(
        limits(&config, &caller("pro", "llama-3-8b")),
        [
            limit("user", 600, Unit::Minute),
            limit("key", 20, Unit::Second),
            limit("model", 1200, Unit::Minute),
            limit("deployment", 200, Unit::Second),
        ]
    );
    // A tier the file doesn't name gets the free tier's limits, not none.
    assert_eq!(
        limits(&config, &caller("gold", "gpt-4o")),
        [
            limit("user", 20, Unit::Minute),
            limit("key", 1, Unit::Second),
            limit("model", 300, Unit::Minute),
            limit("deployment", 200, Unit::Second),
        ]
    );
    // Without the token's headers (jwt_authn refuses such a request first),
    // only the deployment's cap would apply: why the identities must come
    // from the verified token.
    assert_eq!(
        limits(&config, &[]),
        [limit("deployment", 200, Unit::Second)]
    );
}
