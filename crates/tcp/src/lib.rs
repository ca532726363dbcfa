//! ipsan-tcp
