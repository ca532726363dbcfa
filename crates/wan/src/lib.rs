//! ipsan-wan
