//! iscsi-proto
