//! iscsi-wire
