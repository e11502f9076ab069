//! Decimal numbers, read and written by one grammar: `parse` reads
//! arguments and stored fields strictly (what the Lua library accepts too);
//! `write` writes the shortest text that reads back exactly.

mod parse;
mod write;

pub(crate) use parse::digit_run;
pub use parse::{parse_decimal, parse_i64, parse_int16};
pub use write::{IntText, Text, Upper};

/// 10^k as integers, k <= 21 (10^19 < 2^64 < 10^20): the parser's scales
/// and the writer's.
pub(crate) const POW10_INT: [u128; 22] = {
    let mut t = [1u128; 22];
    let mut k = 1;
    while k < 22 {
        t[k] = t[k - 1] * 10;
        k += 1;
    }
    t
};
