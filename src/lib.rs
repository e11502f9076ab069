//! redis-tokenbucket: the `tb` Redis module. This file only loads it (the
//! load arguments, each part's set-up, then the commands and the INFO
//! section registered); each behaviour lives in the file named after it:
//!
//! * `registry`: the command table (flags, keys, ACL categories, docs);
//! * `commands`: the token-bucket handlers, CL.THROTTLE's too (parse, open
//!   key, compute, write, reply);
//! * `leases`: the concurrency-lease handlers (TB.ACQUIRE and friends);
//! * `keyspace`: bucket and lease hashes, and effects replication;
//! * `options`: the load arguments (`cl-throttle auto|off`);
//! * `guard`: panic containment;
//! * `stats`: the `INFO tb` counters;
//! * `eviction`: the warning where `maxmemory-policy` can evict its keys;
//! * `version`: the version, as Redis shows it;
//! * `hooks`: TB.PANIC and TB.FAULT, in `test-hooks` builds only;
//! * `ffi/`: the wall around the module API, the one folder allowed raw
//!   calls (Cargo.toml denies them everywhere else);
//! * `tb_core` (crate in `core/`): bucket arithmetic, leases, CL.THROTTLE,
//!   argument parsing, the stored text, the error type and the contract's
//!   numbers and messages.

mod charge;
mod commands;
mod eviction;
mod ffi;
mod guard;
#[cfg(feature = "test-hooks")]
mod hooks;
mod keyspace;
mod leases;
mod options;
mod quotas;
mod registry;
mod stats;
mod version;

use ffi::{log_warning, Load};
use options::ClThrottle;

ffi::module! {
    name: c"tb",
    version: version::NUMBER,
    init: init,
    unload: keyspace::unload,
}

fn init(load: &Load) -> Result<(), String> {
    let options = options::parse(load.args()).map_err(|e| {
        let shown: Vec<_> = load
            .args()
            .iter()
            .map(|a| String::from_utf8_lossy(a))
            .collect();
        let e = e.to_string();
        format!(
            "{} (given: {}); not loading",
            e.trim_start_matches("ERR "),
            shown.join(" ")
        )
    })?;
    keyspace::init(load)?;
    guard::install_panic_hook();
    #[cfg(feature = "test-hooks")]
    hooks::install();
    load.no_implicit_signal_modified();
    for cmd in registry::COMMANDS {
        if cmd.redis_cell {
            let name = cmd.name.to_string_lossy();
            if options.cl_throttle == ClThrottle::Off {
                log_warning(&format!("tb: {name} not registered (cl-throttle off)"));
                continue;
            }
            if load.has_command(cmd.name) {
                log_warning(&format!(
                    "tb: {name} is already registered (redis-cell?); tb leaves it to that module"
                ));
                continue;
            }
        }
        load.register(cmd)?;
    }
    load.register_info(stats::info)?;
    load.watch_memory(eviction::watch);
    Ok(())
}
