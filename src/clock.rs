//! The server clock, read once per command.

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch. The module runs inside redis-server,
/// so this is the server's own wall clock (and the one libfaketime shifts
/// in the tests). A clock before 1970 reads as 0: the bucket code treats a
/// backwards step as no elapsed time, so this can never mint tokens.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
