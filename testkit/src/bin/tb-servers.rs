//! Where the PyPI servers are, as the Rust tests find them:
//!
//! * `tb-servers`: `TB_SERVER_VALKEY_9_1=/path` and so on, one line per
//!   server, ready for `env $(tb-servers) pytest`;
//! * `tb-servers valkey-9.1 redis-8.2`: those servers' paths, one a line.
//!
//! Exits with 1 (and says why) if a server is missing or unknown.

use std::process::ExitCode;
use testkit::Pypi;

fn main() -> ExitCode {
    let names: Vec<String> = std::env::args().skip(1).collect();
    let lines: Result<Vec<String>, String> = if names.is_empty() {
        Pypi::ALL
            .into_iter()
            .map(|p| Ok(format!("{}={}", p.env_var(), p.path()?.display())))
            .collect()
    } else {
        names
            .iter()
            .map(|n| {
                let known = Pypi::ALL.map(Pypi::name).join(", ");
                let p =
                    Pypi::from_name(n).ok_or(format!("unknown server {n:?} (known: {known})"))?;
                Ok(p.path()?.display().to_string())
            })
            .collect()
    };
    match lines {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tb-servers: {e}");
            ExitCode::FAILURE
        }
    }
}
