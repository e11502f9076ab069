//! Calendar quotas: TB.QUOTA, TB.QPEEK and TB.QADJUST.
//!
//! A quota is a budget of `limit` that resets at the start of each period
//! (a UTC day, ISO week, month or year, or a fixed run of seconds, each
//! shifted by an optional UTC offset), where a bucket refills
//! continuously. Its key is a plain hash of two fields, `used` (a
//! decimal) and `start` (the period's first second), so a bucket's
//! `tokens`/`ts` hash is never read as a quota, nor a quota as a bucket.
//!
//! * [`calendar`]: the periods, in whole seconds;
//! * [`args`]: the commands' arguments;
//! * [`stored`]: the rule that reads a key as a quota;
//! * [`budget`]: charge, peek and adjust, the reply times, the write.

pub mod args;
pub mod budget;
pub mod calendar;
pub mod stored;

pub use args::{parse_qadjust, parse_quota, QuotaCall};
pub use budget::{Effect, Outcome, Quota, Stored};
pub use calendar::{window, Period, Window};
pub use stored::{load, QuotaFields};
