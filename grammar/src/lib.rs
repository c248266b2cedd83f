//! The small languages inside workflow strings: `${...}` interpolation, the filter and `when`
//! language, and sort specifications.
//!
//! This crate knows nothing about YAML and will expose no pest types.
//! Until its grammars land, the compiler keeps these strings as spanned text.
