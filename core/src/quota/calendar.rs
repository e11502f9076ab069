//! The periods a quota resets on: the UTC calendar's days, ISO weeks (from
//! Monday), months and years, or fixed runs of seconds from the Unix
//! epoch, each shifted by a fixed UTC offset for a local midnight.
//!
//! Whole seconds in `i64` and days from the epoch by Howard Hinnant's
//! `days_from_civil` / `civil_from_days`, which the Lua library repeats
//! step for step: no time zone database, no leap seconds (Unix time has
//! none), and no floating point.

/// What a quota's budget resets on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    Day,
    /// ISO weeks: from Monday 00:00.
    Week,
    Month,
    Year,
    /// Fixed periods of this many seconds, from the epoch (plus the offset).
    Seconds(i64),
}

/// One period, in seconds since the Unix epoch: `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub start: i64,
    pub end: i64,
}

const DAY: i64 = 86_400;

/// The period of `period` that holds the second `t`, on a calendar
/// `offset_s` seconds ahead of UTC (UTC+01:00 is 3600).
pub fn window(period: Period, offset_s: i64, t: i64) -> Window {
    let local = t + offset_s;
    let day = local.div_euclid(DAY);
    let (start, end) = match period {
        Period::Seconds(n) => {
            let start = local.div_euclid(n) * n;
            (start, start + n)
        }
        Period::Day => (day * DAY, (day + 1) * DAY),
        Period::Week => {
            // The epoch was a Thursday: day 0 is 3 days after a Monday.
            let monday = day - (day + 3).rem_euclid(7);
            (monday * DAY, (monday + 7) * DAY)
        }
        Period::Month => {
            let (y, m, _) = civil_from_days(day);
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            (
                days_from_civil(y, m, 1) * DAY,
                days_from_civil(ny, nm, 1) * DAY,
            )
        }
        Period::Year => {
            let (y, _, _) = civil_from_days(day);
            (
                days_from_civil(y, 1, 1) * DAY,
                days_from_civil(y + 1, 1, 1) * DAY,
            )
        }
    };
    Window {
        start: start - offset_s,
        end: end - offset_s,
    }
}

/// Days from 1970-01-01 to the proleptic Gregorian date `y-m-d`.
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date `(y, m, d)` of a day from 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2030-01-01T00:00:00Z, a Tuesday.
    const T2030: i64 = 1_893_456_000;

    #[test]
    fn days_round_trip_through_dates() {
        for z in (-800_000..800_000).step_by(7) {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z, "{y}-{m}-{d}");
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(T2030 / DAY), (2030, 1, 1));
        assert_eq!(
            days_from_civil(2000, 3, 1) - days_from_civil(2000, 2, 28),
            2
        );
        assert_eq!(
            days_from_civil(1900, 3, 1) - days_from_civil(1900, 2, 28),
            1
        );
    }

    #[test]
    fn a_second_before_midnight_is_in_the_old_day() {
        let w = window(Period::Day, 0, T2030 - 1);
        assert_eq!(
            w,
            Window {
                start: T2030 - DAY,
                end: T2030
            }
        );
        assert_eq!(window(Period::Day, 0, T2030).start, T2030);
    }

    #[test]
    fn weeks_start_on_monday() {
        // 2029-12-31 was the Monday of 2030-01-01's week.
        let w = window(Period::Week, 0, T2030);
        assert_eq!(w.start, T2030 - DAY);
        assert_eq!(w.end - w.start, 7 * DAY);
    }

    #[test]
    fn an_offset_moves_midnight() {
        // At 23:30 UTC on Dec 31, UTC+01:00 is already in 2030.
        let w = window(Period::Year, 3600, T2030 - 1800);
        assert_eq!(w.start, T2030 - 3600);
        // A fixed hour period on a half-hour offset starts on the half hour.
        let w = window(Period::Seconds(3600), 1800, T2030 + 60);
        assert_eq!(
            w,
            Window {
                start: T2030 - 1800,
                end: T2030 + 1800
            }
        );
    }
}
