//! ipsan-lab: the papers' experiments end to end (issue 6).
//!
//! # Layout
//! - [`model`]: the papers' throughput equations (2008 Eq. 1–6, 2006 Eq. 1–3) and their
//!   generalisation to depth k with link, window and crypto-worker limits. Pure.
pub mod model;
