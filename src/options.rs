//! The module's load arguments: `loadmodule /path/libredis_tokenbucket.so
//! [cl-throttle auto|off]`.

use tb_core::error::{Arg, Error};

/// Whether the module answers redis-cell's CL.THROTTLE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClThrottle {
    /// Registers it unless the server already has the command (redis-cell
    /// loaded first): the default.
    Auto,
    /// Never registers it, so redis-cell can be loaded after this module.
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub cl_throttle: ClThrottle,
}

/// The argument names, for the error that names an unknown one.
const NAMES: &str = "cl-throttle";

/// Reads `name value` pairs, case-insensitively. An unknown name, a
/// missing value or an unknown value refuses the load: a typo must not
/// leave the module running in a mode nobody asked for.
pub fn parse(args: &[&[u8]]) -> Result<Options, Error> {
    let mut options = Options {
        cl_throttle: ClThrottle::Auto,
    };
    for pair in args.chunks(2) {
        let [name, value] = pair else {
            return Err(Error::OneOf(Arg::ClThrottle, "auto, off"));
        };
        if !name.eq_ignore_ascii_case(b"cl-throttle") {
            return Err(Error::OneOf(Arg::ModuleArgument, NAMES));
        }
        options.cl_throttle = if value.eq_ignore_ascii_case(b"auto") {
            ClThrottle::Auto
        } else if value.eq_ignore_ascii_case(b"off") {
            ClThrottle::Off
        } else {
            return Err(Error::OneOf(Arg::ClThrottle, "auto, off"));
        };
    }
    Ok(options)
}
