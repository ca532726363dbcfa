#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]
pub mod blockproto;
pub mod keys;
