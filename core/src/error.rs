//! The module's one error type. Its `Display` is the exact error reply a
//! client gets, built from the contract's templates (`contract::msg`).

use crate::contract::msg;
use std::ffi::CStr;
use std::fmt;

/// An argument an error names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    Max,
    Rate,
    Cost,
    Delta,
    MaxBurst,
    Count,
    Period,
    Quantity,
    Limit,
    LeaseMs,
    Weight,
    /// A quota's UTC offset, in minutes.
    Offset,
    /// A reservation's longest wait (`WAIT max_ms`).
    MaxMs,
    /// TB.CHARGE's count of keys.
    Numkeys,
    /// TB.FAULT's step (test-hooks builds).
    Step,
    /// The module's load argument `cl-throttle`.
    ClThrottle,
    /// A load argument's name.
    ModuleArgument,
}

impl Arg {
    pub fn name(self) -> &'static str {
        match self {
            Arg::Max => "max",
            Arg::Rate => "rate",
            Arg::Cost => "cost",
            Arg::Delta => "delta",
            Arg::MaxBurst => "max_burst",
            Arg::Count => "count",
            Arg::Period => "period",
            Arg::Quantity => "quantity",
            Arg::Limit => "limit",
            Arg::LeaseMs => "lease_ms",
            Arg::Weight => "weight",
            Arg::Offset => "offset",
            Arg::MaxMs => "max_ms",
            Arg::Numkeys => "numkeys",
            Arg::Step => "step",
            Arg::ClThrottle => "cl-throttle",
            Arg::ModuleArgument => "a module argument",
        }
    }
}

/// Why a hash is not a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateError {
    /// Other fields than exactly `tokens` and `ts`.
    Fields,
    Tokens,
    Ts,
}

/// Why a hash is not a quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuotaStateError {
    /// Other fields than exactly `used` and `start`.
    Fields,
    Used,
    Start,
}

/// A step of a write, as a failed write names it in its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    HashSet,
    HashDelete,
    Expire,
    Delete,
    ReplicateHashSet,
    ReplicateHashDelete,
    ReplicateExpire,
    ReplicateDelete,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::HashSet => "HSET",
            Step::HashDelete => "HDEL",
            Step::Expire => "PEXPIREAT",
            Step::Delete => "DEL",
            Step::ReplicateHashSet => "replicate HSET",
            Step::ReplicateHashDelete => "replicate HDEL",
            Step::ReplicateExpire => "replicate PEXPIREAT",
            Step::ReplicateDelete => "replicate DEL",
        }
    }
}

/// Everything a command can answer with an error. `Option<usize>` is the
/// TB.MCONSUME group an error is about (from 1), `None` elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// Wrong number of arguments for this command (its registered name).
    Arity(&'static CStr),
    TooManyGroups,
    /// Not a finite decimal (garbage, NaN, infinity, hex, spaces...).
    NotANumber(Arg, Option<usize>),
    MaxOutOfRange(Option<usize>),
    RateOutOfRange(Option<usize>),
    /// `max / rate` above the longest fill time.
    FillTooSlow(Option<usize>),
    CostNegative(Option<usize>),
    CostAboveMax(Option<usize>),
    /// Positive, but too small to change a balance near `max`.
    CostTooSmall(Option<usize>),
    DuplicateKey {
        group: usize,
        first: usize,
    },
    /// A quota's limit outside `(0, MAX_CAPACITY]`.
    LimitOutOfRange(Option<usize>),
    /// A quota's cost above its limit.
    CostAboveLimit(Option<usize>),
    /// A positive quota cost too small to change what is used.
    QuotaCostTooSmall(Option<usize>),
    /// A quota period that is neither a calendar unit nor whole seconds.
    BadPeriod(Option<usize>),
    /// The argument at this position should be `OFFSET`.
    ExpectedOffset(usize),
    /// The argument at this position should be `WAIT`.
    ExpectedWait(usize),
    /// The key holds a hash that is not a quota.
    NotAQuota(QuotaStateError, Option<usize>),
    /// TB.CHARGE and TB.ACQUIRE: the argument at this position should
    /// start a clause.
    ExpectedClause(usize),
    /// CL.THROTTLE: not an integer.
    NotAnInteger(Arg),
    /// CL.THROTTLE: below the argument's least value.
    TooSmall(Arg, i64),
    /// CL.THROTTLE: `max_burst + 1` above the largest capacity.
    BurstTooLarge,
    /// CL.THROTTLE: `count / period` above the largest rate.
    ThrottleRateTooHigh,
    /// CL.THROTTLE: the bucket would take too long to fill.
    ThrottleFillTooSlow,
    /// An integer argument outside `[least, most]`.
    IntOutOfRange(Arg, i64, i64),
    /// TB.ACQUIRE: a weight above the limit could never fit.
    WeightAboveLimit,
    /// TB.ACQUIRE and friends: an empty or too long lease id.
    BadId,
    /// TB.ACQUIRE: a word (not a number) where the weight or a clause may
    /// stand, at this position.
    ExpectedWeight(usize),
    /// TB.ACQUIRE: this clause names the lease key.
    BucketIsLeaseKey(usize),
    /// The key holds a hash that is not a set of leases.
    NotALeaseKey,
    /// The key holds something other than a hash (Redis's own text).
    WrongType,
    /// The key holds a hash that is not a bucket.
    NotABucket(StateError, Option<usize>),
    /// A step of a write failed; nothing after it was attempted.
    WriteFailed(Step),
    /// An argument outside its list of values.
    OneOf(Arg, &'static str),
    /// Something the module itself got wrong (never the caller).
    Internal(&'static str),
    /// The command panicked, and the panic was contained.
    Panic,
}

impl Error {
    /// The same error about TB.MCONSUME's group `group` (from 1), for
    /// errors found before the group was known (reading its key).
    pub fn in_group(self, group: usize) -> Error {
        match self {
            Error::NotABucket(why, _) => Error::NotABucket(why, Some(group)),
            Error::NotAQuota(why, _) => Error::NotAQuota(why, Some(group)),
            other => other,
        }
    }
}

/// ` (group N)`, or nothing.
struct InGroup(Option<usize>);

impl fmt::Display for InGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(g) => render(f, msg::GROUP, &[("group", &g)]),
            None => Ok(()),
        }
    }
}

/// Writes `template` with each `{name}` replaced by its value in `values`
/// (an unknown name is written as it stands).
fn render(
    f: &mut fmt::Formatter<'_>,
    template: &str,
    values: &[(&str, &dyn fmt::Display)],
) -> fmt::Result {
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        f.write_str(&rest[..open])?;
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return f.write_str(&rest[open..]);
        };
        let name = &after[..close];
        match values.iter().find(|(n, _)| *n == name) {
            Some((_, value)) => write!(f, "{value}")?,
            None => f.write_str(&rest[open..open + close + 2])?,
        }
        rest = &after[close + 1..];
    }
    f.write_str(rest)
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = |group: &Option<usize>| InGroup(*group);
        match self {
            Error::Arity(command) => render(
                f,
                msg::ARITY,
                &[("command", &command.to_str().unwrap_or_default())],
            ),
            Error::TooManyGroups => f.write_str(msg::TOO_MANY_GROUPS),
            Error::NotANumber(arg, group) => render(
                f,
                msg::NOT_A_NUMBER,
                &[("arg", &arg.name()), ("in_group", &g(group))],
            ),
            Error::MaxOutOfRange(group) => {
                render(f, msg::MAX_OUT_OF_RANGE, &[("in_group", &g(group))])
            }
            Error::RateOutOfRange(group) => {
                render(f, msg::RATE_OUT_OF_RANGE, &[("in_group", &g(group))])
            }
            Error::FillTooSlow(group) => render(f, msg::FILL_TOO_SLOW, &[("in_group", &g(group))]),
            Error::CostNegative(group) => render(f, msg::COST_NEGATIVE, &[("in_group", &g(group))]),
            Error::CostAboveMax(group) => {
                render(f, msg::COST_ABOVE_MAX, &[("in_group", &g(group))])
            }
            Error::CostTooSmall(group) => {
                render(f, msg::COST_TOO_SMALL, &[("in_group", &g(group))])
            }
            Error::DuplicateKey { group, first } => {
                render(f, msg::DUPLICATE_KEY, &[("group", group), ("first", first)])
            }
            Error::LimitOutOfRange(group) => {
                render(f, msg::LIMIT_OUT_OF_RANGE, &[("in_group", &g(group))])
            }
            Error::CostAboveLimit(group) => {
                render(f, msg::COST_ABOVE_LIMIT, &[("in_group", &g(group))])
            }
            Error::QuotaCostTooSmall(group) => {
                render(f, msg::QUOTA_COST_TOO_SMALL, &[("in_group", &g(group))])
            }
            Error::BadPeriod(group) => render(f, msg::BAD_PERIOD, &[("in_group", &g(group))]),
            Error::ExpectedClause(position) => {
                render(f, msg::EXPECTED_CLAUSE, &[("position", position)])
            }
            Error::ExpectedOffset(position) => {
                render(f, msg::EXPECTED_OFFSET, &[("position", position)])
            }
            Error::ExpectedWait(position) => {
                render(f, msg::EXPECTED_WAIT, &[("position", position)])
            }
            Error::NotAQuota(why, group) => {
                let template = match why {
                    QuotaStateError::Fields => msg::QUOTA_BAD_FIELDS,
                    QuotaStateError::Used => msg::QUOTA_BAD_USED,
                    QuotaStateError::Start => msg::QUOTA_BAD_START,
                };
                render(f, template, &[("in_group", &g(group))])
            }
            Error::NotAnInteger(arg) => render(f, msg::NOT_AN_INTEGER, &[("arg", &arg.name())]),
            Error::TooSmall(arg, least) => {
                render(f, msg::TOO_SMALL, &[("arg", &arg.name()), ("least", least)])
            }
            Error::BurstTooLarge => f.write_str(msg::BURST_TOO_LARGE),
            Error::ThrottleRateTooHigh => f.write_str(msg::THROTTLE_RATE_TOO_HIGH),
            Error::ThrottleFillTooSlow => f.write_str(msg::THROTTLE_FILL_TOO_SLOW),
            Error::IntOutOfRange(arg, least, most) => render(
                f,
                msg::INT_OUT_OF_RANGE,
                &[("arg", &arg.name()), ("least", least), ("most", most)],
            ),
            Error::WeightAboveLimit => f.write_str(msg::WEIGHT_ABOVE_LIMIT),
            Error::BadId => f.write_str(msg::BAD_ID),
            Error::ExpectedWeight(position) => {
                render(f, msg::EXPECTED_WEIGHT, &[("position", position)])
            }
            Error::BucketIsLeaseKey(group) => {
                render(f, msg::BUCKET_IS_LEASE_KEY, &[("group", group)])
            }
            Error::NotALeaseKey => f.write_str(msg::NOT_A_LEASE_KEY),
            Error::WrongType => f.write_str(msg::WRONGTYPE),
            Error::NotABucket(why, group) => {
                let template = match why {
                    StateError::Fields => msg::BAD_FIELDS,
                    StateError::Tokens => msg::BAD_TOKENS,
                    StateError::Ts => msg::BAD_TS,
                };
                render(f, template, &[("in_group", &g(group))])
            }
            Error::WriteFailed(step) => render(f, msg::WRITE_FAILED, &[("step", &step.name())]),
            Error::OneOf(arg, values) => {
                render(f, msg::ONE_OF, &[("arg", &arg.name()), ("values", values)])
            }
            Error::Internal(what) => render(f, msg::INTERNAL, &[("what", what)]),
            Error::Panic => f.write_str(msg::PANIC),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_fill_in_their_marks() {
        assert_eq!(
            Error::Arity(c"tb.consume").to_string(),
            "ERR wrong number of arguments for 'tb.consume' command"
        );
        assert_eq!(
            Error::NotANumber(Arg::Rate, Some(2)).to_string(),
            "ERR rate must be a finite decimal number (group 2)"
        );
        assert_eq!(
            Error::CostNegative(None).to_string(),
            "ERR cost must be >= 0"
        );
        assert_eq!(
            Error::DuplicateKey { group: 4, first: 2 }.to_string(),
            "ERR duplicate key: group 4 repeats the key of group 2"
        );
        assert_eq!(
            Error::TooSmall(Arg::Period, 1).to_string(),
            "ERR period must be >= 1"
        );
        assert_eq!(
            Error::NotABucket(StateError::Ts, None)
                .in_group(3)
                .to_string(),
            "ERR key is not a token bucket: field ts is not an integer of microseconds (group 3)"
        );
        assert_eq!(Error::WrongType.in_group(3).to_string(), msg::WRONGTYPE);
        assert_eq!(
            Error::WriteFailed(Step::ReplicateExpire).to_string(),
            "ERR tb could not write the key: replicate PEXPIREAT failed, see the server log"
        );
    }
}
