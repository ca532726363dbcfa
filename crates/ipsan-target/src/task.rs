//! Data-Out bookkeeping moved to the engine: [`iscsi_proto::engine::r2t`].

pub use iscsi_proto::engine::r2t::{DataError, R2tPlan, WriteState};
