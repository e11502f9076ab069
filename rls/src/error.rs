//! The crate's one error type: its Display is the whole message.

use std::fmt;

/// What went wrong, worded for the operator or the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A configuration file is wrong at `line` (1-based; 0 when the file as
    /// a whole is, e.g. unreadable).
    Config {
        path: String,
        line: usize,
        reason: String,
    },
    /// A command-line flag or environment variable is wrong.
    Usage(String),
    /// A request the service refuses (the gRPC status INVALID_ARGUMENT).
    Request(String),
    /// Redis failed: no answer, a lost connection, an error reply.
    Redis(String),
    /// Redis answered, but not as any backend answers (a reply of another
    /// shape): the gRPC status INTERNAL, and no outage for the breaker.
    Reply(String),
}

impl Error {
    pub fn config(path: &str, line: usize, reason: impl Into<String>) -> Self {
        Error::Config {
            path: path.to_string(),
            line,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config {
                path,
                line: 0,
                reason,
            } => write!(f, "{path}: {reason}"),
            Error::Config { path, line, reason } => write!(f, "{path}:{line}: {reason}"),
            Error::Usage(m) | Error::Request(m) | Error::Redis(m) | Error::Reply(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_error_names_path_line_and_reason() {
        let e = Error::config("config/a.yaml", 7, "invalid rate limit unit 'fortnight'");
        assert_eq!(
            e.to_string(),
            "config/a.yaml:7: invalid rate limit unit 'fortnight'"
        );
        assert_eq!(
            Error::config("x.yaml", 0, "unreadable").to_string(),
            "x.yaml: unreadable"
        );
    }
}
