//! The test kit of redis-tokenbucket, shared by the integration tests
//! (`tests/`), tb-core's tests (`core/tests`, and its unit tests' RNG) and
//! the fuzz targets (`fuzz/`).
//!
//! Always built (only `std` and `tb_core`):
//! * [`oracles`]: the properties of tb-core under hostile input, checked by
//!   the libFuzzer targets and by their proptest equivalents;
//! * [`Rng`]: the seeded RNG;
//! * [`KeyView`]: a key as a test holds it, read by tb-core's one rule;
//! * [`pypi`]: where `make venv` put the PyPI servers.
//!
//! Feature `vectors`: [`vectors`], the schema of `tests/vectors.json` and
//! the module's argv of a case.
//!
//! Feature `server` (the redis client): real servers on free loopback ports
//! ([`Server`], [`Config`], [`cluster::Cluster`]), client helpers, a fake
//! clock through libfaketime, the Lua library and EVAL script, and a
//! server's replication stream ([`ReplicationStream`]).
//!
//! * `TB_MODULE`: path of the module (default: the release build).
//! * `TB_REDIS_SERVER`: the server binary (default: `redis-server`), so the
//!   same suite runs against Redis 7.0, Redis 8.2 and Valkey.

pub mod key;
pub mod oracles;
pub mod pypi;
mod rng;
#[cfg(feature = "vectors")]
pub mod vectors;

#[cfg(feature = "server")]
mod client;
#[cfg(feature = "server")]
pub mod cluster;
#[cfg(feature = "server")]
mod faketime;
#[cfg(feature = "server")]
mod lua;
#[cfg(feature = "server")]
mod server;
#[cfg(feature = "server")]
mod stream;

pub use key::{lease_summary_problem, live_weight, write_leases, KeyView};
pub use pypi::{pypi_server, Pypi};
pub use rng::Rng;

#[cfg(feature = "server")]
pub use client::*;
#[cfg(feature = "server")]
pub use faketime::*;
#[cfg(feature = "server")]
pub use lua::*;
#[cfg(feature = "server")]
pub use server::*;
#[cfg(feature = "server")]
pub use stream::*;

use std::path::{Path, PathBuf};

/// The repository's root directory.
pub fn root() -> PathBuf {
    // This crate sits one level below the root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ has a parent")
        .to_path_buf()
}
