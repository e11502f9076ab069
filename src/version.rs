//! The module's version, from Cargo.toml, in the two forms Redis shows.

use std::ffi::CStr;
use std::os::raw::c_int;

/// As `INFO tb` (`tb_version`) and `COMMAND DOCS` (`since`) show it.
pub const TEXT: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(s) => s,
        Err(_) => c"0.0.0",
    };

/// As `MODULE LIST` shows it: major * 10000 + minor * 100 + patch (0.1.0
/// is 100).
pub const NUMBER: c_int = {
    const fn part(s: &[u8], index: usize) -> c_int {
        let (mut i, mut n, mut v) = (0, 0, 0);
        while i < s.len() {
            match s[i] {
                b'.' | b'-' | b'+' => {
                    if n == index {
                        return v;
                    }
                    n += 1;
                    v = 0;
                }
                c => v = v * 10 + (c - b'0') as c_int,
            }
            i += 1;
        }
        v
    }
    let v = env!("CARGO_PKG_VERSION").as_bytes();
    part(v, 0) * 10_000 + part(v, 1) * 100 + part(v, 2)
};
