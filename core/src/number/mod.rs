//! Decimal numbers, read and written by one grammar: `parse` reads
//! arguments and stored fields strictly (what the Lua library accepts too);
//! `write` writes the shortest text that reads back exactly.

mod parse;
mod write;

pub(crate) use parse::digit_run;
pub use parse::{parse_decimal, parse_i64, parse_int16};
pub use write::{IntText, Text, Upper};
