//! A request's descriptors mapped to buckets and calendar quotas: what to
//! ask Redis, and what
//! is decided without it (no limit, `unlimited`, replaced, a limit that can
//! never pass).

use crate::config::{Config, Limit};
use crate::error::Error;
use crate::keys::{bucket_key, quota_key};
use crate::matcher;
use crate::unit::Unit;
use std::collections::HashMap;

/// The module's largest group count in one TB.MCONSUME (contract: max_groups).
pub const MAX_DESCRIPTORS: usize = 10_000;

/// One descriptor of a request, without gRPC types.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Descriptor {
    pub entries: Vec<(String, String)>,
    /// Its own hits_addend, if set (0: check without charging).
    pub hits_addend: Option<u64>,
    /// Envoy's limit override: requests_per_unit and the unit's proto number.
    pub limit_override: Option<(u32, i32)>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    pub domain: String,
    pub descriptors: Vec<Descriptor>,
    /// 0 (unset) counts as 1, as in Envoy.
    pub hits_addend: u32,
}

/// The limit a status reports (`current_limit`).
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    pub name: String,
    pub requests_per_unit: u32,
    pub unit: Unit,
}

/// One bucket of a TB.MCONSUME call, or one clause of a TB.CHARGE.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub key: String,
    /// The bucket's max, or the quota's budget per period.
    pub max: u64,
    /// Tokens per second; unused by a quota.
    pub rate: f64,
    pub cost: u64,
    /// Some: a calendar quota (TB.CHARGE's QUOTA clause), not a bucket.
    pub calendar: Option<Calendar>,
}

/// A calendar quota's period: the module's DAY, WEEK, MONTH or YEAR, and
/// its OFFSET in minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calendar {
    pub period: &'static str,
    pub utc_offset_minutes: i32,
}

/// What decides one descriptor.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// No limit matched, or it was replaced: OK.
    NoLimit,
    /// `unlimited`: OK, remaining u32::MAX.
    Unlimited,
    /// Decided here: `over` when it can never pass (requests_per_unit 0,
    /// or a cost above the bucket's max); OK for a check of cost 0 on
    /// requests_per_unit 0.
    Local {
        limit: Shown,
        over: bool,
        shadow: bool,
    },
    /// Group `group` of the enforced call.
    Enforced { limit: Shown, group: usize },
    /// The shadow call `call`, a TB.MCONSUME of its own.
    Shadow { limit: Shown, call: usize },
}

/// Where a descriptor's limit sits in the config, as its metrics name it.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched {
    /// The limit's key path in the config (`domain.key_value...`).
    pub full_key: String,
    pub detailed_metric: bool,
    /// The share_threshold pattern standing for each entry's value.
    pub shared: Vec<Option<String>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub decisions: Vec<Decision>,
    /// Per descriptor, the config's limit it met (None: no match, or
    /// Envoy's override, which is no config's), so metrics need not match
    /// again.
    pub matched: Vec<Option<Matched>>,
    /// All-or-nothing, in one call. Every cost is 0 (a check that writes
    /// nothing) when a local decision already denies the request.
    pub enforced: Vec<Group>,
    /// One call each, so that a shadow denial never stops another charge.
    pub shadow: Vec<Group>,
}

impl Plan {
    /// Whether a descriptor decided here denies the request.
    pub fn denied_locally(&self) -> bool {
        self.decisions.iter().any(|d| {
            matches!(
                d,
                Decision::Local {
                    over: true,
                    shadow: false,
                    ..
                }
            )
        })
    }
}

/// A descriptor's hits: its own hits_addend, else the request's (0: 1).
pub fn cost_of(request: &Request, d: &Descriptor) -> u64 {
    d.hits_addend
        .unwrap_or(u64::from(request.hits_addend.max(1)))
}

/// The plan of `request` under `config`; an empty domain, no descriptor,
/// too many, or an override with an unknown unit is refused.
pub fn plan(config: &Config, request: &Request) -> Result<Plan, Error> {
    if request.domain.is_empty() {
        return Err(Error::Request("rate limit domain must not be empty".into()));
    }
    if request.descriptors.is_empty() {
        return Err(Error::Request(
            "rate limit descriptor list must not be empty".into(),
        ));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Error::Request(format!(
            "{} descriptors in one request: at most {MAX_DESCRIPTORS}",
            request.descriptors.len()
        )));
    }
    // The limit each descriptor meets, owned (an override is no config's).
    let mut limits: Vec<Option<(Limit, Vec<Option<String>>)>> =
        Vec::with_capacity(request.descriptors.len());
    let mut matched = Vec::with_capacity(request.descriptors.len());
    for (i, d) in request.descriptors.iter().enumerate() {
        let known = config.domains.contains_key(&request.domain);
        let found = match d.limit_override {
            Some((rpu, unit)) if known => {
                let unit = Unit::from_proto(unit).ok_or_else(|| {
                    Error::Request(format!(
                        "descriptor {i}: its limit override has the unknown unit {unit}"
                    ))
                })?;
                let limit = Limit {
                    requests_per_unit: rpu,
                    unit: Some(unit),
                    unlimited: false,
                    name: String::new(),
                    replaces: Vec::new(),
                    shadow_mode: false,
                    detailed_metric: false,
                    burst: None,
                    calendar: false,
                    utc_offset_minutes: 0,
                    full_key: String::new(),
                };
                matched.push(None);
                Some((limit, vec![None; d.entries.len()]))
            }
            _ => {
                let m = matcher::find(config, &request.domain, &d.entries);
                matched.push(m.as_ref().map(|m| Matched {
                    full_key: m.limit.full_key.clone(),
                    detailed_metric: m.limit.detailed_metric,
                    shared: m.shared.clone(),
                }));
                m.map(|m| (m.limit.clone(), m.shared))
            }
        };
        limits.push(found);
    }
    let replaced: Vec<&str> = limits
        .iter()
        .flatten()
        .flat_map(|(l, _)| l.replaces.iter().map(String::as_str))
        .collect();

    let mut decisions = Vec::with_capacity(limits.len());
    let mut enforced: Vec<Group> = Vec::new();
    let mut by_key: HashMap<String, usize> = HashMap::new();
    let mut shadow = Vec::new();
    for (d, found) in request.descriptors.iter().zip(&limits) {
        let Some((limit, shared)) = found else {
            decisions.push(Decision::NoLimit);
            continue;
        };
        if limit.unlimited {
            decisions.push(Decision::Unlimited);
            continue;
        }
        if !limit.name.is_empty() && replaced.contains(&limit.name.as_str()) {
            decisions.push(Decision::NoLimit);
            continue;
        }
        let Some(unit) = limit.unit else {
            decisions.push(Decision::NoLimit);
            continue;
        };
        let shown = Shown {
            name: limit.name.clone(),
            requests_per_unit: limit.requests_per_unit,
            unit,
        };
        let cost = cost_of(request, d);
        let max = limit.burst.unwrap_or(u64::from(limit.requests_per_unit));
        if limit.requests_per_unit == 0 || cost > max {
            let over = cost > 0 || limit.requests_per_unit > 0;
            decisions.push(Decision::Local {
                limit: shown,
                over,
                shadow: limit.shadow_mode,
            });
            continue;
        }
        let entries = d
            .entries
            .iter()
            .zip(shared)
            .map(|((k, v), s)| (k.as_str(), s.as_deref().unwrap_or(v.as_str())));
        // The config allows `calendar` only on DAY to YEAR.
        let calendar = match unit.calendar_period() {
            Some(period) if limit.calendar => Some(Calendar {
                period,
                utc_offset_minutes: limit.utc_offset_minutes,
            }),
            _ => None,
        };
        let key = match calendar {
            Some(c) => quota_key(&request.domain, c.period, c.utc_offset_minutes, entries),
            None => bucket_key(&request.domain, entries),
        };
        let rate = f64::from(limit.requests_per_unit) / unit.seconds() as f64;
        if limit.shadow_mode {
            shadow.push(Group {
                key,
                max,
                rate,
                cost,
                calendar,
            });
            decisions.push(Decision::Shadow {
                limit: shown,
                call: shadow.len() - 1,
            });
            continue;
        }
        // The same bucket twice in one request pays both costs at once
        // (TB.MCONSUME refuses a repeated key).
        let group = match by_key.get(&key) {
            Some(&g) => {
                enforced[g].cost = enforced[g].cost.saturating_add(cost);
                g
            }
            None => {
                enforced.push(Group {
                    key: key.clone(),
                    max,
                    rate,
                    cost,
                    calendar,
                });
                by_key.insert(key, enforced.len() - 1);
                enforced.len() - 1
            }
        };
        decisions.push(Decision::Enforced {
            limit: shown,
            group,
        });
    }
    // A merged cost above its max can never pass: decided here too.
    for d in decisions.iter_mut() {
        if let Decision::Enforced { limit, group } = d {
            if enforced[*group].cost > enforced[*group].max {
                *d = Decision::Local {
                    limit: limit.clone(),
                    over: true,
                    shadow: false,
                };
            }
        }
    }
    let mut plan = Plan {
        decisions,
        matched,
        enforced,
        shadow,
    };
    if plan.denied_locally() {
        for g in &mut plan.enforced {
            g.cost = 0;
        }
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        let mut c = Config::default();
        c.add_str("t.yaml", text).unwrap();
        c
    }

    fn desc(pairs: &[(&str, &str)]) -> Descriptor {
        Descriptor {
            entries: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Descriptor::default()
        }
    }

    fn req(domain: &str, descriptors: Vec<Descriptor>) -> Request {
        Request {
            domain: domain.into(),
            descriptors,
            hits_addend: 0,
        }
    }

    const C: &str = "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 60}\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 7200, burst: 10}\n  - key: zero\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: ldap\n    rate_limit: {unlimited: true}\n  - key: shadow\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: month\n    rate_limit: {unit: month, requests_per_unit: 2592000}\n";

    #[test]
    fn units_become_buckets() {
        let c = config(C);
        let p = plan(
            &c,
            &req(
                "d",
                vec![
                    desc(&[("ip", "1")]),
                    desc(&[("user", "u")]),
                    desc(&[("month", "m")]),
                ],
            ),
        )
        .unwrap();
        assert_eq!(p.enforced.len(), 3);
        assert_eq!(
            (p.enforced[0].max, p.enforced[0].rate, p.enforced[0].cost),
            (60, 1.0, 1)
        );
        assert_eq!((p.enforced[1].max, p.enforced[1].rate), (10, 2.0));
        assert_eq!((p.enforced[2].max, p.enforced[2].rate), (2_592_000, 1.0));
        assert_eq!(p.enforced[0].key, "rls:{d}:ip=1");
        assert!(p.shadow.is_empty());
    }

    const CAL: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: month, requests_per_unit: 1000, calendar: true}\n  - key: team\n    rate_limit: {unit: day, requests_per_unit: 50, calendar: true, utc_offset_minutes: 330}\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 60}\n  - key: shadow\n    shadow_mode: true\n    rate_limit: {unit: week, requests_per_unit: 5, calendar: true}\n";

    #[test]
    fn calendar_limits_become_quotas_beside_the_buckets() {
        let c = config(CAL);
        let mut r = req(
            "d",
            vec![
                desc(&[("user", "u")]),
                desc(&[("team", "t")]),
                desc(&[("ip", "1")]),
                desc(&[("shadow", "s")]),
            ],
        );
        r.hits_addend = 3;
        let p = plan(&c, &r).unwrap();
        let clauses: Vec<_> = p
            .enforced
            .iter()
            .map(|g| (g.key.as_str(), g.max, g.cost, g.calendar))
            .collect();
        let cal = |period, utc_offset_minutes| {
            Some(Calendar {
                period,
                utc_offset_minutes,
            })
        };
        assert_eq!(
            clauses,
            vec![
                ("rls:q:month:{d}:user=u", 1000, 3, cal("MONTH", 0)),
                ("rls:q:day+330:{d}:team=t", 50, 3, cal("DAY", 330)),
                ("rls:{d}:ip=1", 60, 3, None),
            ]
        );
        assert_eq!(p.shadow.len(), 1);
        assert_eq!(p.shadow[0].key, "rls:q:week:{d}:shadow=s");
        assert_eq!(p.shadow[0].calendar, cal("WEEK", 0));
        // A cost above the budget can never pass: decided here, the rest checked.
        r.hits_addend = 51;
        let p = plan(&c, &r).unwrap();
        assert!(matches!(p.decisions[1], Decision::Local { over: true, .. }));
        assert!(p.enforced.iter().all(|g| g.cost == 0));
    }

    #[test]
    fn hits_addend_is_the_cost() {
        let c = config(C);
        let mut r = req(
            "d",
            vec![
                desc(&[("ip", "1")]),
                desc(&[("ip", "2")]),
                desc(&[("ip", "3")]),
            ],
        );
        r.hits_addend = 5;
        r.descriptors[1].hits_addend = Some(0);
        r.descriptors[2].hits_addend = Some(9);
        let p = plan(&c, &r).unwrap();
        let costs: Vec<u64> = p.enforced.iter().map(|g| g.cost).collect();
        assert_eq!(costs, [5, 0, 9]);
        r.hits_addend = 0;
        r.descriptors[1].hits_addend = None;
        let costs: Vec<u64> = plan(&c, &r)
            .unwrap()
            .enforced
            .iter()
            .map(|g| g.cost)
            .collect();
        assert_eq!(costs, [1, 1, 9]);
    }

    #[test]
    fn zero_and_a_cost_above_max_deny_without_charging_the_rest() {
        let c = config(C);
        let p = plan(
            &c,
            &req("d", vec![desc(&[("zero", "z")]), desc(&[("ip", "1")])]),
        )
        .unwrap();
        assert!(matches!(
            p.decisions[0],
            Decision::Local {
                over: true,
                shadow: false,
                ..
            }
        ));
        assert!(p.denied_locally());
        assert_eq!(p.enforced[0].cost, 0, "the other bucket is only checked");
        let mut r = req("d", vec![desc(&[("user", "u")]), desc(&[("ip", "1")])]);
        r.hits_addend = 11; // user's burst is 10
        let p = plan(&c, &r).unwrap();
        assert!(matches!(p.decisions[0], Decision::Local { over: true, .. }));
        assert_eq!(p.enforced.len(), 1);
        assert_eq!(p.enforced[0].cost, 0);
        let mut check = req("d", vec![desc(&[("zero", "z")])]);
        check.descriptors[0].hits_addend = Some(0);
        let p = plan(&c, &check).unwrap();
        assert!(matches!(
            p.decisions[0],
            Decision::Local { over: false, .. }
        ));
    }

    #[test]
    fn unlimited_unknown_and_shadow() {
        let c = config(C);
        let p = plan(
            &c,
            &req(
                "d",
                vec![
                    desc(&[("ldap", "x")]),
                    desc(&[("nope", "x")]),
                    desc(&[("shadow", "s")]),
                ],
            ),
        )
        .unwrap();
        assert_eq!(p.decisions[0], Decision::Unlimited);
        assert_eq!(p.decisions[1], Decision::NoLimit);
        assert!(matches!(p.decisions[2], Decision::Shadow { call: 0, .. }));
        assert!(p.enforced.is_empty());
        assert_eq!(p.shadow[0].key, "rls:{d}:shadow=s");
        let p = plan(&c, &req("elsewhere", vec![desc(&[("ip", "1")])])).unwrap();
        assert_eq!(p.decisions, vec![Decision::NoLimit]);
    }

    #[test]
    fn replaces_drops_the_named_limit() {
        let c = config("domain: example7\ndescriptors:\n  - key: key_1\n    value: value_1\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}\n  - key: key_2\n    value: value_2\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          replaces: [{name: specific_limit}]\n          requests_per_unit: 10\n          unit: second\n");
        let one = desc(&[("key_1", "value_1"), ("user", "bkthomps")]);
        let two = desc(&[("key_2", "value_2"), ("user", "bkthomps")]);
        let p = plan(&c, &req("example7", vec![one.clone()])).unwrap();
        assert_eq!(p.enforced[0].max, 5);
        let p = plan(&c, &req("example7", vec![one, two])).unwrap();
        assert_eq!(p.decisions[0], Decision::NoLimit);
        assert_eq!(p.enforced.len(), 1);
        assert_eq!(p.enforced[0].max, 10);
    }

    #[test]
    fn the_same_bucket_twice_pays_both_costs_in_one_group() {
        let c = config(C);
        let p = plan(
            &c,
            &req("d", vec![desc(&[("ip", "1")]), desc(&[("ip", "1")])]),
        )
        .unwrap();
        assert_eq!(p.enforced.len(), 1);
        assert_eq!(p.enforced[0].cost, 2);
        let mut r = req("d", vec![desc(&[("user", "u")]), desc(&[("user", "u")])]);
        r.hits_addend = 6; // 12 > burst 10
        let p = plan(&c, &r).unwrap();
        assert!(p.denied_locally());
    }

    #[test]
    fn an_override_sets_the_limit() {
        let c = config(C);
        let mut d = desc(&[("anything", "x")]);
        d.limit_override = Some((30, 2));
        let p = plan(&c, &req("d", vec![d.clone()])).unwrap();
        assert_eq!((p.enforced[0].max, p.enforced[0].rate), (30, 0.5));
        d.limit_override = Some((30, 0));
        let e = plan(&c, &req("d", vec![d])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "descriptor 0: its limit override has the unknown unit 0"
        );
    }

    #[test]
    fn bad_requests_are_refused() {
        let c = config(C);
        assert_eq!(
            plan(&c, &req("", vec![desc(&[("ip", "1")])]))
                .unwrap_err()
                .to_string(),
            "rate limit domain must not be empty"
        );
        assert_eq!(
            plan(&c, &req("d", vec![])).unwrap_err().to_string(),
            "rate limit descriptor list must not be empty"
        );
        let many = vec![desc(&[("ip", "1")]); MAX_DESCRIPTORS + 1];
        assert_eq!(
            plan(&c, &req("d", many)).unwrap_err().to_string(),
            "10001 descriptors in one request: at most 10000"
        );
    }
}
