//! Envoy's rate limit units and their lengths in seconds, as
//! envoyproxy/ratelimit defines them (a MONTH is 30 days, a YEAR 365).

/// A `unit` of a rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// The unit a config names, in any case (the peer upper-cases it).
    pub fn parse(name: &str) -> Option<Unit> {
        Some(match name.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// The unit of the protos' enum value (RateLimitResponse.RateLimit.Unit,
    /// and type.v3.RateLimitUnit, which number them alike); 0 is UNKNOWN.
    pub fn from_proto(value: i32) -> Option<Unit> {
        Some(match value {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }

    pub fn to_proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The module's calendar period of this unit (TB.QUOTA's DAY, WEEK,
    /// MONTH, YEAR); None below a day, which has no calendar.
    pub fn calendar_period(self) -> Option<&'static str> {
        match self {
            Unit::Day => Some("DAY"),
            Unit::Week => Some("WEEK"),
            Unit::Month => Some("MONTH"),
            Unit::Year => Some("YEAR"),
            Unit::Second | Unit::Minute | Unit::Hour => None,
        }
    }

    /// Seconds in one unit: the window length envoyproxy/ratelimit uses.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    #[test]
    fn lengths_are_the_peers() {
        let secs: Vec<u64> = ALL.iter().map(|u| u.seconds()).collect();
        assert_eq!(secs, [1, 60, 3600, 86400, 604800, 2592000, 31536000]);
    }

    #[test]
    fn only_day_to_year_have_a_calendar() {
        let periods: Vec<_> = ALL.iter().map(|u| u.calendar_period()).collect();
        assert_eq!(
            periods,
            [
                None,
                None,
                None,
                Some("DAY"),
                Some("WEEK"),
                Some("MONTH"),
                Some("YEAR")
            ]
        );
    }

    #[test]
    fn names_parse_in_any_case_and_unknown_is_none() {
        assert_eq!(Unit::parse("second"), Some(Unit::Second));
        assert_eq!(Unit::parse("Month"), Some(Unit::Month));
        assert_eq!(Unit::parse("YEAR"), Some(Unit::Year));
        assert_eq!(Unit::parse("unknown"), None);
        assert_eq!(Unit::parse(""), None);
        assert_eq!(Unit::parse("fortnight"), None);
    }

    #[test]
    fn proto_numbers_round_trip_and_unknown_is_none() {
        for u in ALL {
            assert_eq!(Unit::from_proto(u.to_proto()), Some(u));
        }
        assert_eq!(Unit::from_proto(0), None);
        assert_eq!(Unit::from_proto(8), None);
        assert_eq!(Unit::Week.to_proto(), 7);
    }
}
