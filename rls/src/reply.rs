//! The answer to Envoy from a plan and the buckets' replies: the overall
//! code, one status per descriptor, and envoyproxy/ratelimit's headers.

use crate::plan::{Decision, Plan, Shown};

/// One bucket's or quota's reply: `[allowed, remaining, retry_after_ms,
/// reset_after_ms]`. A quota's reset is its period's end (0 while nothing
/// is used), and a denial's retry the same end: its budget never refills
/// within the period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub allowed: bool,
    pub remaining: i64,
    pub retry_after_ms: u64,
    pub reset_after_ms: u64,
}

/// One descriptor's status.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    pub over: bool,
    pub limit: Option<Shown>,
    pub remaining: u32,
    /// When a request denied here passes, or, when OK, when the bucket is
    /// full again (a quota: when its period ends); None where no bucket is
    /// involved.
    pub until_reset_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub over: bool,
    pub statuses: Vec<Status>,
    pub headers: Vec<(String, String)>,
}

/// The names of the limit, remaining and reset headers (the peer's
/// LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER).
#[derive(Debug, Clone, PartialEq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        HeaderNames {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

fn clamp(remaining: i64) -> u32 {
    u32::try_from(remaining.max(0)).unwrap_or(u32::MAX)
}

fn from_bucket(limit: &Shown, b: &Bucket, over: bool) -> Status {
    Status {
        over,
        limit: Some(limit.clone()),
        // Over the limit leaves nothing, as the peer reports it.
        remaining: if over || !b.allowed {
            0
        } else {
            clamp(b.remaining)
        },
        until_reset_ms: Some(if b.allowed {
            b.reset_after_ms
        } else {
            b.retry_after_ms
        }),
    }
}

/// The reply: `enforced` holds the enforced call's buckets in group order
/// (empty when there was none), `shadow` one bucket per shadow call.
/// `headers`: the names to send, None to send none (the peer's default).
pub fn reply(
    plan: &Plan,
    enforced: &[Bucket],
    shadow: &[Bucket],
    headers: Option<&HeaderNames>,
) -> Reply {
    let statuses: Vec<Status> = plan
        .decisions
        .iter()
        .map(|d| match d {
            Decision::NoLimit => Status {
                over: false,
                limit: None,
                remaining: 0,
                until_reset_ms: None,
            },
            Decision::Unlimited => Status {
                over: false,
                limit: None,
                remaining: u32::MAX,
                until_reset_ms: None,
            },
            Decision::Local {
                limit,
                over,
                shadow,
            } => Status {
                over: *over && !shadow,
                limit: Some(limit.clone()),
                remaining: 0,
                until_reset_ms: None,
            },
            Decision::Enforced { limit, group } => match enforced.get(*group) {
                Some(b) => from_bucket(limit, b, !b.allowed),
                None => Status {
                    over: true,
                    limit: Some(limit.clone()),
                    remaining: 0,
                    until_reset_ms: None,
                },
            },
            // A shadow limit answers OK whatever its bucket said.
            Decision::Shadow { limit, call } => match shadow.get(*call) {
                Some(b) => from_bucket(limit, b, false),
                None => Status {
                    over: false,
                    limit: Some(limit.clone()),
                    remaining: 0,
                    until_reset_ms: None,
                },
            },
        })
        .collect();
    let over = statuses.iter().any(|s| s.over);
    let headers = headers
        .map(|names| headers_of(&statuses, names))
        .unwrap_or_default();
    Reply {
        over,
        statuses,
        headers,
    }
}

/// The peer's choice: the last descriptor over the limit, else the one
/// with the least remaining (the first of equals).
fn headers_of(statuses: &[Status], names: &HeaderNames) -> Vec<(String, String)> {
    let mut chosen: Option<&Status> = None;
    let mut least = u32::MAX;
    for s in statuses {
        if s.limit.is_none() {
            continue;
        }
        if s.over {
            chosen = Some(s);
            least = 0;
        } else if s.remaining < least {
            chosen = Some(s);
            least = s.remaining;
        }
    }
    let Some(s) = chosen else { return Vec::new() };
    let Some(limit) = &s.limit else {
        return Vec::new();
    };
    let reset_s = s.until_reset_ms.unwrap_or(0).div_ceil(1000);
    vec![
        (names.limit.clone(), limit.requests_per_unit.to_string()),
        (names.remaining.clone(), s.remaining.to_string()),
        (names.reset.clone(), reset_s.to_string()),
    ]
}

/// The answer of `--on-redis-error open` when Redis failed: what needed
/// Redis is OK with no limit and no numbers (none was read: none is made
/// up); what was decided here (`requests_per_unit: 0`, `unlimited`, a
/// cost above the max) stands.
pub fn admitted_without_redis(plan: &Plan, headers: Option<&HeaderNames>) -> Reply {
    let decisions = plan
        .decisions
        .iter()
        .map(|d| match d {
            Decision::Enforced { .. } | Decision::Shadow { .. } => Decision::NoLimit,
            other => other.clone(),
        })
        .collect();
    let plan = Plan {
        decisions,
        matched: Vec::new(),
        enforced: Vec::new(),
        shadow: Vec::new(),
    };
    reply(&plan, &[], &[], headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Group;
    use crate::unit::Unit;

    fn shown(rpu: u32) -> Shown {
        Shown {
            name: String::new(),
            requests_per_unit: rpu,
            unit: Unit::Second,
        }
    }

    fn group() -> Group {
        Group {
            key: "k".into(),
            max: 1,
            rate: 1.0,
            cost: 1,
            calendar: None,
        }
    }

    fn ok(remaining: i64, reset: u64) -> Bucket {
        Bucket {
            allowed: true,
            remaining,
            retry_after_ms: 0,
            reset_after_ms: reset,
        }
    }

    fn denied(retry: u64) -> Bucket {
        Bucket {
            allowed: false,
            remaining: 0,
            retry_after_ms: retry,
            reset_after_ms: 9000,
        }
    }

    fn plan(decisions: Vec<Decision>, groups: usize, shadow: usize) -> Plan {
        Plan {
            matched: vec![None; decisions.len()],
            decisions,
            enforced: vec![group(); groups],
            shadow: vec![group(); shadow],
        }
    }

    #[test]
    fn admitted_without_redis_makes_up_no_number_and_keeps_local_denials() {
        let decisions = vec![
            Decision::Enforced {
                limit: shown(10),
                group: 0,
            },
            Decision::Shadow {
                limit: shown(3),
                call: 0,
            },
            Decision::Unlimited,
        ];
        let r = admitted_without_redis(&plan(decisions.clone(), 1, 1), None);
        assert!(!r.over);
        let fields: Vec<_> = r
            .statuses
            .iter()
            .map(|s| (s.over, s.limit.is_some(), s.remaining, s.until_reset_ms))
            .collect();
        assert_eq!(
            fields,
            vec![
                (false, false, 0, None),
                (false, false, 0, None),
                (false, false, u32::MAX, None)
            ]
        );
        let mut with_zero = decisions;
        with_zero.push(Decision::Local {
            limit: shown(0),
            over: true,
            shadow: false,
        });
        let r = admitted_without_redis(&plan(with_zero, 1, 1), Some(&HeaderNames::default()));
        assert!(r.over, "a limit of 0 denies without Redis");
        assert_eq!(
            r.headers[0],
            ("RateLimit-Limit".to_string(), "0".to_string())
        );
    }

    #[test]
    fn statuses_follow_the_buckets() {
        let p = plan(
            vec![
                Decision::Enforced {
                    limit: shown(10),
                    group: 0,
                },
                Decision::Enforced {
                    limit: shown(5),
                    group: 1,
                },
                Decision::NoLimit,
                Decision::Unlimited,
            ],
            2,
            0,
        );
        let r = reply(&p, &[ok(7, 300), denied(1500)], &[], None);
        assert!(r.over);
        assert_eq!(
            (
                r.statuses[0].over,
                r.statuses[0].remaining,
                r.statuses[0].until_reset_ms
            ),
            (false, 7, Some(300))
        );
        assert_eq!(
            (
                r.statuses[1].over,
                r.statuses[1].remaining,
                r.statuses[1].until_reset_ms
            ),
            (true, 0, Some(1500))
        );
        assert_eq!(
            (
                r.statuses[2].over,
                r.statuses[2].limit.is_none(),
                r.statuses[2].remaining
            ),
            (false, true, 0)
        );
        assert_eq!(
            (r.statuses[3].over, r.statuses[3].remaining),
            (false, u32::MAX)
        );
        assert!(r.headers.is_empty());
        let r = reply(&p, &[ok(7, 300), ok(0, 1000)], &[], None);
        assert!(!r.over);
    }

    #[test]
    fn shadow_answers_ok_but_reports_its_bucket() {
        let p = plan(
            vec![Decision::Shadow {
                limit: shown(3),
                call: 0,
            }],
            0,
            1,
        );
        let r = reply(&p, &[], &[denied(200)], None);
        assert!(!r.over);
        assert_eq!((r.statuses[0].over, r.statuses[0].remaining), (false, 0));
        let local = plan(
            vec![Decision::Local {
                limit: shown(0),
                over: true,
                shadow: true,
            }],
            0,
            0,
        );
        assert!(!reply(&local, &[], &[], None).over);
        let enforced = plan(
            vec![Decision::Local {
                limit: shown(0),
                over: true,
                shadow: false,
            }],
            0,
            0,
        );
        assert!(reply(&enforced, &[], &[], None).over);
    }

    #[test]
    fn headers_name_the_tightest_descriptor() {
        let names = HeaderNames::default();
        let p = plan(
            vec![
                Decision::Enforced {
                    limit: shown(10),
                    group: 0,
                },
                Decision::Enforced {
                    limit: shown(5),
                    group: 1,
                },
                Decision::Unlimited,
            ],
            2,
            0,
        );
        let r = reply(&p, &[ok(7, 300), ok(2, 2001)], &[], Some(&names));
        let want = |l: &str, rem: &str, reset: &str| {
            vec![
                ("RateLimit-Limit".to_string(), l.to_string()),
                ("RateLimit-Remaining".to_string(), rem.to_string()),
                ("RateLimit-Reset".to_string(), reset.to_string()),
            ]
        };
        assert_eq!(r.headers, want("5", "2", "3"));
        let r = reply(&p, &[denied(1200), ok(2, 2001)], &[], Some(&names));
        assert_eq!(r.headers, want("10", "0", "2"));
        let none = plan(vec![Decision::NoLimit, Decision::Unlimited], 0, 0);
        assert!(reply(&none, &[], &[], Some(&names)).headers.is_empty());
    }

    #[test]
    fn a_huge_or_negative_remaining_is_clamped() {
        let p = plan(
            vec![Decision::Enforced {
                limit: shown(1),
                group: 0,
            }],
            1,
            0,
        );
        assert_eq!(
            reply(&p, &[ok(1 << 40, 0)], &[], None).statuses[0].remaining,
            u32::MAX
        );
        assert_eq!(reply(&p, &[ok(-3, 0)], &[], None).statuses[0].remaining, 0);
    }
}
