//! The circuit breaker, as the clients have it (clients/spec/breaker.json):
//! `failures` Redis failures within `window_ms` open it; open, calls are
//! answered by the failure policy without calling Redis; after
//! `cooldown_ms` one call probes while the others still skip; the probe's
//! success closes it, its failure opens it for another cooldown. Only
//! Redis failures count. Times are a monotonic clock's milliseconds.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enter {
    /// Call Redis.
    Call,
    /// Call Redis, as the one probe of a half-open breaker.
    Probe,
    /// Don't: answer by the policy.
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub failures: usize,
    pub window_ms: u64,
    pub cooldown_ms: u64,
}

struct Inner {
    state: State,
    recent: VecDeque<u64>,
    opened_at: u64,
    /// When the running probe started.
    probe_at: Option<u64>,
}

pub struct Breaker {
    pub limits: Limits,
    inner: Mutex<Inner>,
}

impl Breaker {
    pub fn new(limits: Limits) -> Breaker {
        Breaker {
            limits,
            inner: Mutex::new(Inner {
                state: State::Closed,
                recent: VecDeque::new(),
                opened_at: 0,
                probe_at: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update leaves the state whole: a panic elsewhere can't break it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> State {
        self.lock().state
    }

    pub fn enter(&self, now: u64) -> Enter {
        let mut b = self.lock();
        match b.state {
            State::Closed => return Enter::Call,
            State::Open if now.saturating_sub(b.opened_at) < self.limits.cooldown_ms => {
                return Enter::Skip
            }
            _ => b.state = State::HalfOpen,
        }
        // One probe at a time; one that never reported (its caller went
        // away) is replaced after a cooldown.
        if matches!(b.probe_at, Some(at) if now.saturating_sub(at) < self.limits.cooldown_ms) {
            return Enter::Skip;
        }
        b.probe_at = Some(now);
        Enter::Probe
    }

    /// Redis answered.
    pub fn success(&self, probe: bool) {
        let mut b = self.lock();
        if probe || b.state != State::Closed {
            b.state = State::Closed;
            b.recent.clear();
            b.probe_at = None;
        }
    }

    /// Redis failed this call; true if that opened a closed breaker.
    pub fn failure(&self, probe: bool, now: u64) -> bool {
        let mut b = self.lock();
        if probe || b.state != State::Closed {
            open(&mut b, now);
            return false;
        }
        b.recent.push_back(now);
        while matches!(b.recent.front(), Some(&t) if now.saturating_sub(t) > self.limits.window_ms)
        {
            b.recent.pop_front();
        }
        if b.recent.len() >= self.limits.failures {
            open(&mut b, now);
            return true;
        }
        false
    }

    /// The call ended without news of Redis: another call may probe.
    pub fn release(&self, probe: bool) {
        if probe {
            self.lock().probe_at = None;
        }
    }
}

fn open(b: &mut Inner, now: u64) {
    b.state = State::Open;
    b.opened_at = now;
    b.probe_at = None;
    b.recent.clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Every scenario of the clients' breaker.json, on this breaker.
    #[test]
    fn the_clients_breaker_scenarios_hold() {
        let text = include_str!("../../clients/spec/breaker.json");
        let spec: Value = serde_json::from_str(text).unwrap();
        let scenarios = spec["scenarios"].as_array().unwrap();
        assert!(scenarios.len() >= 10);
        for s in scenarios {
            let name = s["name"].as_str().unwrap();
            let n = |k: &str| s["breaker"][k].as_u64().unwrap();
            let b = Breaker::new(Limits {
                failures: n("failures") as usize,
                window_ms: n("window_ms"),
                cooldown_ms: n("cooldown_ms"),
            });
            let mut now = 1_000_000;
            for step in s["steps"].as_array().unwrap() {
                let probe = step["probe"].as_bool().unwrap_or(false);
                if let Some(e) = step["enter"].as_str() {
                    let want = match e {
                        "call" => Enter::Call,
                        "probe" => Enter::Probe,
                        _ => Enter::Skip,
                    };
                    assert_eq!(b.enter(now), want, "{name}: {step}");
                } else if let Some(r) = step["report"].as_str() {
                    match r {
                        "success" => b.success(probe),
                        "failure" => {
                            b.failure(probe, now);
                        }
                        _ => b.release(probe),
                    }
                } else if let Some(st) = step["state"].as_str() {
                    let want = match st {
                        "closed" => State::Closed,
                        "open" => State::Open,
                        _ => State::HalfOpen,
                    };
                    assert_eq!(b.state(), want, "{name}: {step}");
                } else if let Some(ms) = step["advance_ms"].as_u64() {
                    now += ms;
                } else {
                    panic!("{name}: unknown step {step}");
                }
            }
        }
    }

    #[test]
    fn failure_says_when_it_opened_a_closed_breaker() {
        let b = Breaker::new(Limits {
            failures: 2,
            window_ms: 1000,
            cooldown_ms: 100,
        });
        assert!(!b.failure(false, 0));
        assert!(b.failure(false, 1));
        assert!(!b.failure(false, 2), "already open");
    }
}
