//! ipsan-seal
