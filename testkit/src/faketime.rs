//! Server clocks the test controls, through libfaketime.

use crate::pypi::{pypi_server, Pypi};
use crate::server::Config;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A clock the test controls: a server started with `FakeClock::config`
/// reads its time from a file through libfaketime, frozen until `set`.
pub struct FakeClock {
    file: PathBuf,
}

impl FakeClock {
    /// Starts frozen at `start_us` microseconds since the epoch.
    pub fn new(start_us: i64) -> FakeClock {
        static N: AtomicUsize = AtomicUsize::new(0);
        let file = std::env::temp_dir().join(format!(
            "tb-faketime-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let clock = FakeClock { file };
        clock.set(start_us);
        clock
    }

    /// Moves the server's clock to `us` (microseconds since the epoch).
    pub fn set(&self, us: i64) {
        let secs = us.div_euclid(1_000_000);
        let frac = us.rem_euclid(1_000_000);
        // libfaketime's absolute, frozen format: "YYYY-MM-DD hh:mm:ss[.frac]".
        let out = Command::new("date")
            .args(["-u", "-d", &format!("@{secs}"), "+%Y-%m-%d %H:%M:%S"])
            .output()
            .expect("date");
        let stamp = format!(
            "{}.{frac:06}\n",
            String::from_utf8_lossy(&out.stdout).trim()
        );
        std::fs::write(&self.file, stamp).expect("write faketime file");
    }

    /// Server config: Valkey 9.1 from PyPI (Debian's jemalloc build hangs
    /// under libfaketime) with the fake clock preloaded.
    pub fn config(&self) -> Config {
        let lib = faketime_lib();
        Config {
            bin: pypi_server(Pypi::Valkey91),
            ..Config::default()
        }
        .env("LD_PRELOAD", &lib)
        .env("FAKETIME_TIMESTAMP_FILE", &self.file.to_string_lossy())
        .env("FAKETIME_NO_CACHE", "1")
    }
}

impl Drop for FakeClock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// Valkey 9.1 whose clock runs normally but `offset` away from the real
/// one (libfaketime syntax, e.g. "-3600" for an hour behind).
pub fn skewed_clock(offset: &str) -> Config {
    Config {
        bin: pypi_server(Pypi::Valkey91),
        ..Config::default()
    }
    .env("LD_PRELOAD", &faketime_lib())
    .env("FAKETIME", offset)
}

/// Debian's libfaketime for the running architecture (`make deps`).
fn faketime_lib() -> String {
    let lib = format!(
        "/usr/lib/{}-linux-gnu/faketime/libfaketime.so.1",
        std::env::consts::ARCH
    );
    assert!(
        Path::new(&lib).exists(),
        "libfaketime not installed ({lib}): run `make deps`"
    );
    lib
}
