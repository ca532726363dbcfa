//! The place where payloads are transformed on their way out and back in: the hook the Seal
//! layer (issue 5; Kamisaka et al.'s encryption middleware "above the SCSI layer") plugs into.
//!
//! A transform sees whole command payloads together with their starting LBA, so a cipher can
//! derive per-block nonces/tweaks from the address. It must keep the length unchanged (the
//! LBA range a command covers is fixed by the CDB); a transform that needs room for tags keeps
//! them elsewhere (e.g. a metadata region), which is the Seal crate's business.

use bytes::{Bytes, BytesMut};

use crate::error::Result;

/// Transforms write payloads before they are sent and read payloads after they arrive.
pub trait PayloadTransform: Send + Sync + std::fmt::Debug {
    /// Called by `Session::write`/`write_fua` with the caller's data; returns what goes on the
    /// wire. Must return exactly `data.len()` bytes.
    fn outbound(&self, lba: u64, data: Bytes) -> Result<Bytes>;
    /// Called by `Session::read` with the reassembled Data-In; returns what the caller sees.
    fn inbound(&self, lba: u64, data: BytesMut) -> Result<BytesMut>;
}

/// The identity transform: what `seal=none` means, and a reference for implementors.
#[derive(Debug, Default, Clone, Copy)]
pub struct Identity;

impl PayloadTransform for Identity {
    fn outbound(&self, _lba: u64, data: Bytes) -> Result<Bytes> {
        Ok(data)
    }
    fn inbound(&self, _lba: u64, data: BytesMut) -> Result<BytesMut> {
        Ok(data)
    }
}
