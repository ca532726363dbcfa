//! ipsan-target
