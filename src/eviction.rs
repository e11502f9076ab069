//! The warning where the server may evict the module's keys: logged once
//! per setting at load and after each change, and shown by `INFO tb`
//! (`tb_maxmemory_policy`, and `tb_eviction_risk`, which the Prometheus
//! kit exports and alerts on).

use crate::ffi::{log_warning, Memory};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use tb_core::eviction::Risk;

/// The settings last seen: the policy (for INFO) and the setting last
/// warned about, so that a setting is named once, not at every check.
struct Seen {
    policy: Option<CString>,
    warned: Option<(String, u64)>,
}

static SEEN: Mutex<Seen> = Mutex::new(Seen {
    policy: None,
    warned: None,
});
/// 1 where the settings can evict the module's keys.
static RISK: AtomicU64 = AtomicU64::new(0);

/// The watcher `ffi` runs at load and whenever the settings may change.
pub fn watch(memory: &Memory) {
    let risk = Risk::of(&memory.policy, memory.maxmemory);
    RISK.store(risk.flag(), Relaxed);
    let Ok(mut seen) = SEEN.lock() else {
        return;
    };
    seen.policy = CString::new(memory.policy.replace('\0', " ")).ok();
    let setting = (memory.policy.clone(), memory.maxmemory);
    match risk.warning(&memory.policy, memory.maxmemory) {
        Some(text) if seen.warned.as_ref() != Some(&setting) => {
            log_warning(&text);
            seen.warned = Some(setting);
        }
        Some(_) => {}
        // Safe again: a later return to the same risky setting warns anew.
        None => seen.warned = None,
    }
}

/// `tb_eviction_risk`.
pub fn risk() -> u64 {
    RISK.load(Relaxed)
}

/// `tb_maxmemory_policy`: the policy last read (empty before the first read).
pub fn policy() -> CString {
    SEEN.lock()
        .ok()
        .and_then(|seen| seen.policy.clone())
        .unwrap_or_default()
}
