//! The quota periods (`tb_core::quota::calendar`) against chrono's
//! calendar: every kind of period, at random seconds over four centuries,
//! at the edges of months of 28 to 31 days and of leap years, on offsets
//! either side of UTC.

use chrono::{DateTime, Datelike, Duration, NaiveDate, NaiveDateTime};
use tb_core::quota::{window, Period, Window};

/// chrono's answer: the period holding `t` on a clock `offset_s` ahead.
fn expected(period: Period, offset_s: i64, t: i64) -> Window {
    let local: NaiveDateTime = DateTime::from_timestamp(t + offset_s, 0)
        .expect("in range")
        .naive_utc();
    let date = local.date();
    let day = |d: NaiveDate| {
        d.and_hms_opt(0, 0, 0)
            .expect("midnight")
            .and_utc()
            .timestamp()
    };
    let (start, end) = match period {
        Period::Seconds(n) => {
            let s = (t + offset_s).div_euclid(n) * n;
            (s, s + n)
        }
        Period::Day => (day(date), day(date + Duration::days(1))),
        Period::Week => {
            let monday = date - Duration::days(i64::from(date.weekday().num_days_from_monday()));
            (day(monday), day(monday + Duration::days(7)))
        }
        Period::Month => {
            let first = date.with_day(1).expect("day 1");
            let next = if first.month() == 12 {
                NaiveDate::from_ymd_opt(first.year() + 1, 1, 1)
            } else {
                NaiveDate::from_ymd_opt(first.year(), first.month() + 1, 1)
            }
            .expect("a date");
            (day(first), day(next))
        }
        Period::Year => {
            let first = NaiveDate::from_ymd_opt(date.year(), 1, 1).expect("a date");
            let next = NaiveDate::from_ymd_opt(date.year() + 1, 1, 1).expect("a date");
            (day(first), day(next))
        }
    };
    Window {
        start: start - offset_s,
        end: end - offset_s,
    }
}

const PERIODS: [Period; 7] = [
    Period::Day,
    Period::Week,
    Period::Month,
    Period::Year,
    Period::Seconds(1),
    Period::Seconds(3600),
    Period::Seconds(7 * 86_400 + 13),
];

const OFFSETS: [i64; 7] = [0, 60, -60, 19_800, -34_200, 86_340, -86_340];

#[test]
fn periods_match_chrono_at_random_seconds() {
    let mut rng = testkit::Rng(0x5EED_CA1E_DA12_0001);
    // 1900 to 2300: across the century rule and the 400-year one.
    let (lo, hi) = (-2_208_988_800i64, 10_413_792_000i64);
    for _ in 0..200_000 {
        let t = lo + rng.below((hi - lo) as u64) as i64;
        let period = PERIODS[rng.below(PERIODS.len() as u64) as usize];
        let offset = OFFSETS[rng.below(OFFSETS.len() as u64) as usize];
        assert_eq!(
            window(period, offset, t),
            expected(period, offset, t),
            "{period:?} {offset} {t}"
        );
    }
}

#[test]
fn month_and_year_edges_match_chrono() {
    // Every month's first second and the second before it, 1999 to 2101:
    // months of 28, 29, 30 and 31 days, 2000 (a leap year) and 2100 (not).
    for year in 1999..=2101 {
        for month in 1..=12 {
            let first = NaiveDate::from_ymd_opt(year, month, 1).expect("a date");
            let t = first
                .and_hms_opt(0, 0, 0)
                .expect("midnight")
                .and_utc()
                .timestamp();
            for offset in OFFSETS {
                for at in [t - offset - 1, t - offset, t - offset + 1] {
                    for period in [Period::Month, Period::Year, Period::Week, Period::Day] {
                        assert_eq!(
                            window(period, offset, at),
                            expected(period, offset, at),
                            "{period:?} {offset} {at}"
                        );
                    }
                }
            }
        }
    }
    // February's length, from the windows themselves.
    let feb = |y: i32| {
        let t = NaiveDate::from_ymd_opt(y, 2, 10)
            .expect("a date")
            .and_hms_opt(0, 0, 0)
            .expect("midnight")
            .and_utc()
            .timestamp();
        let w = window(Period::Month, 0, t);
        (w.end - w.start) / 86_400
    };
    assert_eq!(
        [feb(1900), feb(2000), feb(2024), feb(2026), feb(2100)],
        [28, 29, 29, 28, 28]
    );
}
