//! The quota commands' arguments, checked left to right (the Lua library
//! reports the same first error): `TB.QUOTA key limit period [cost]
//! [OFFSET minutes]` and TB.QPEEK; `TB.QADJUST key limit period delta
//! [OFFSET minutes]`. OFFSET is a keyword, so that its minutes can never
//! be taken for the cost.

use super::budget::Quota;
use super::calendar::Period;
use crate::args::{charges_nothing, Argv};
use crate::contract::{MAX_CAPACITY, MAX_OFFSET_MINUTES, MAX_PERIOD_SECONDS};
use crate::error::{Arg, Error};
use crate::number::{parse_decimal, parse_i64};

/// A validated quota call; its key is `argv[1]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuotaCall {
    pub quota: Quota,
    /// `cost` for TB.QUOTA and TB.QPEEK, `delta` for TB.QADJUST.
    pub amount: f64,
}

/// `limit`, in TB.CHARGE's clause `g` (from 1) or alone.
pub(crate) fn limit(bytes: &[u8], g: Option<usize>) -> Result<f64, Error> {
    let limit = parse_decimal(bytes).ok_or(Error::NotANumber(Arg::Limit, g))?;
    if !(limit > 0.0 && limit <= MAX_CAPACITY) {
        return Err(Error::LimitOutOfRange(g));
    }
    Ok(limit)
}

/// DAY, WEEK, MONTH, YEAR (any case), or whole seconds.
pub(crate) fn period(bytes: &[u8], g: Option<usize>) -> Result<Period, Error> {
    let named = [
        (&b"DAY"[..], Period::Day),
        (b"WEEK", Period::Week),
        (b"MONTH", Period::Month),
        (b"YEAR", Period::Year),
    ];
    if let Some((_, p)) = named.iter().find(|(n, _)| bytes.eq_ignore_ascii_case(n)) {
        return Ok(*p);
    }
    match parse_i64(bytes) {
        Some(n) if (1..=MAX_PERIOD_SECONDS).contains(&n) => Ok(Period::Seconds(n)),
        _ => Err(Error::BadPeriod(g)),
    }
}

pub(crate) fn cost(bytes: &[u8], limit: f64, g: Option<usize>) -> Result<f64, Error> {
    let cost = parse_decimal(bytes).ok_or(Error::NotANumber(Arg::Cost, g))?;
    if cost < 0.0 {
        return Err(Error::CostNegative(g));
    }
    if cost > limit {
        return Err(Error::CostAboveLimit(g));
    }
    // Adding a cost this small to what is used near the limit changes
    // nothing, so the call would pass forever (as for a bucket's max).
    if charges_nothing(cost, limit) {
        return Err(Error::QuotaCostTooSmall(g));
    }
    Ok(cost)
}

/// `OFFSET minutes` at `argv[at]`: seconds ahead of UTC.
pub(crate) fn offset(argv: &(impl Argv + ?Sized), at: usize) -> Result<i64, Error> {
    if !argv.arg(at).eq_ignore_ascii_case(b"OFFSET") {
        return Err(Error::ExpectedOffset(at));
    }
    let m = MAX_OFFSET_MINUTES;
    let minutes = parse_i64(argv.arg(at + 1)).ok_or(Error::NotAnInteger(Arg::Offset))?;
    if !(-m..=m).contains(&minutes) {
        return Err(Error::IntOutOfRange(Arg::Offset, -m, m));
    }
    Ok(minutes * 60)
}

/// The shared shape: `key limit period [amount] [OFFSET minutes]`, with
/// `amount` required for TB.QADJUST.
fn parse(argv: &(impl Argv + ?Sized), adjust: bool) -> Result<QuotaCall, Error> {
    let n = argv.count();
    let (has_amount, offset_at) = match (n, adjust) {
        (4, false) => (false, None),
        (5, _) => (true, None),
        (6, false) => (false, Some(4)),
        (7, _) => (true, Some(5)),
        _ => return Err(Error::Arity(argv.command())),
    };
    let limit = limit(argv.arg(2), None)?;
    let period = period(argv.arg(3), None)?;
    let amount = match (has_amount, adjust) {
        (true, true) => parse_decimal(argv.arg(4)).ok_or(Error::NotANumber(Arg::Delta, None))?,
        (true, false) => cost(argv.arg(4), limit, None)?,
        // The default cost of 1 could never pass a limit this small.
        (false, _) if limit < 1.0 => return Err(Error::CostAboveLimit(None)),
        (false, _) => 1.0,
    };
    let offset_s = offset_at
        .map(|at| offset(argv, at))
        .transpose()?
        .unwrap_or(0);
    Ok(QuotaCall {
        quota: Quota {
            limit,
            period,
            offset_s,
        },
        amount,
    })
}

/// `TB.QUOTA key limit period [cost] [OFFSET minutes]`, and TB.QPEEK.
pub fn parse_quota(argv: &(impl Argv + ?Sized)) -> Result<QuotaCall, Error> {
    parse(argv, false)
}

/// `TB.QADJUST key limit period delta [OFFSET minutes]`.
pub fn parse_qadjust(argv: &(impl Argv + ?Sized)) -> Result<QuotaCall, Error> {
    parse(argv, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{QADJUST, QUOTA};

    fn call(s: &[&str]) -> Result<QuotaCall, Error> {
        parse_quota(s)
    }

    #[test]
    fn cost_and_offset_are_told_apart_by_the_keyword() {
        let c = call(&["tb.quota", "k", "100", "day", "OFFSET", "-300"]).unwrap();
        assert_eq!((c.amount, c.quota.offset_s), (1.0, -18_000));
        let c = call(&["tb.quota", "k", "100", "MONTH", "7", "offset", "60"]).unwrap();
        assert_eq!(
            (c.amount, c.quota.offset_s, c.quota.period),
            (7.0, 3600, Period::Month)
        );
        let c = call(&["tb.quota", "k", "100", "3600"]).unwrap();
        assert_eq!(c.quota.period, Period::Seconds(3600));
    }

    #[test]
    fn errors_name_the_argument() {
        let cases: [(&[&str], Error); 10] = [
            (&["tb.quota", "k", "1"], Error::Arity(QUOTA)),
            (
                &["tb.quota", "k", "x", "DAY"],
                Error::NotANumber(Arg::Limit, None),
            ),
            (&["tb.quota", "k", "0", "DAY"], Error::LimitOutOfRange(None)),
            (&["tb.quota", "k", "5", "FORTNIGHT"], Error::BadPeriod(None)),
            (&["tb.quota", "k", "5", "0"], Error::BadPeriod(None)),
            (
                &["tb.quota", "k", "5", "DAY", "6"],
                Error::CostAboveLimit(None),
            ),
            (
                &["tb.quota", "k", "0.5", "DAY"],
                Error::CostAboveLimit(None),
            ),
            (
                &["tb.quota", "k", "5", "DAY", "1", "2"],
                Error::ExpectedOffset(4),
            ),
            (
                &["tb.quota", "k", "5", "DAY", "OFFSET", "1.5"],
                Error::NotAnInteger(Arg::Offset),
            ),
            (
                &["tb.quota", "k", "5", "DAY", "1", "OFFSET", "1440"],
                Error::IntOutOfRange(Arg::Offset, -1439, 1439),
            ),
        ];
        for (argv, want) in cases {
            assert_eq!(call(argv).err(), Some(want), "{argv:?}");
        }
        assert_eq!(
            parse_qadjust(&["tb.qadjust", "k", "1", "DAY"][..]),
            Err(Error::Arity(QADJUST))
        );
        assert_eq!(
            parse_qadjust(&["tb.qadjust", "k", "5", "DAY", "-9"][..]).map(|c| c.amount),
            Ok(-9.0)
        );
    }
}
