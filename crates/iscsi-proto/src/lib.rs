//! iscsi-proto

pub mod chap;
