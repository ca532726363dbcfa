//! ipsan-initiator
