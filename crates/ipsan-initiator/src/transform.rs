//! The place where payloads are transformed on their way out and back in: the hook the Seal
//! layer (issue 5; Kamisaka et al.'s encryption middleware "above the SCSI layer") plugs into.
//!
//! With a transform installed ([`crate::Session::set_transform`]), the data of *every* SCSI
//! command goes through it — READ/WRITE payloads and also INQUIRY or READ CAPACITY data — as
//! docs/seal.md §4 requires. The transform may change the length (Seal appends tags): the
//! ExpectedDataTransferLength on the wire (RFC 7143 §11.3.4) is the transformed length, and the
//! CDB keeps describing plaintext blocks. Transforms are asynchronous, so a crypto worker pool
//! can seal the next commands while earlier ones wait on the network (the papers'
//! "pre-processing").

use std::future::Future;
use std::pin::Pin;

use bytes::{Bytes, BytesMut};

use crate::error::Result;

/// What a payload is bound to: the command it belongs to. Seal authenticates it alongside the
/// data so a chunk cannot be replayed into another command, LUN or block range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandInfo {
    /// The 8-byte LUN field as sent in the BHS (SAM-5 §4.7 encoding).
    pub lun: u64,
    /// Starting LBA of the CDB's extent ([`ipsan_scsi::cdb::extent`], the rule the target binds
    /// with too); 0 for commands that address no block range.
    pub lba: u64,
    /// Blocks of the CDB's extent ([`ipsan_scsi::cdb::extent`]); 0 for commands that address
    /// no block range.
    pub blocks: u32,
    /// CDB operation code.
    pub opcode: u8,
    /// The Initiator Task Tag the command is sent with (assigned before the transform runs).
    pub itt: u32,
}

impl CommandInfo {
    /// The binding of `cdb` sent to `lun` with ITT `itt`: its extent by the rule the target
    /// binds with ([`ipsan_scsi::cdb::extent`], every CDB form) and its operation code.
    pub fn of(lun: u64, itt: u32, cdb: &[u8; 16]) -> Self {
        let (lba, blocks) = ipsan_scsi::cdb::extent(cdb);
        Self {
            lun,
            lba,
            blocks,
            opcode: ipsan_scsi::cdb::build::opcode(cdb),
            itt,
        }
    }
}

/// A boxed future returned by a transform.
pub type TransformFuture<T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'static>>;

/// Transforms write payloads before they are sent and read payloads after they arrive.
pub trait PayloadTransform: Send + Sync + std::fmt::Debug {
    /// The length on the wire of `plain_len` bytes of payload (the read's EDTL); `None` if that
    /// length cannot be carried.
    fn wire_len(&self, plain_len: usize) -> Option<usize>;
    /// Outbound data (WRITE payloads and any other data-out): returns what goes on the wire.
    fn outbound(&self, cmd: CommandInfo, data: Bytes) -> TransformFuture<Bytes>;
    /// [`PayloadTransform::outbound`] on the caller's thread, at once: for data made again
    /// while the caller holds a lock (a write reassigned to another connection of its session
    /// at ErrorRecoveryLevel 2, sealed under that connection's keys). `None`: this transform
    /// cannot (the default).
    fn outbound_now(&self, _cmd: CommandInfo, _data: &Bytes) -> Option<Result<Bytes>> {
        None
    }
    /// The outbound form of `len` bytes as the caller's data *unchanged* followed by the bytes
    /// returned, when this transform has that form for them (Seal `none` without
    /// compression, larger than it seals on the caller's thread: the plaintext and a trailer,
    /// issue 27): the write then goes without a copy of its data. It reserves what
    /// [`PayloadTransform::outbound`] would (Seal's counters). `None`: no such form; use
    /// `outbound` (the default).
    fn outbound_tail(&self, _cmd: CommandInfo, _len: usize) -> Option<Result<Bytes>> {
        None
    }
    /// Inbound data as reassembled from Data-In (possibly shorter than the EDTL when the
    /// target sent less): returns what the caller sees.
    fn inbound(&self, cmd: CommandInfo, data: BytesMut) -> TransformFuture<BytesMut>;
    /// [`PayloadTransform::inbound`] without reporting a refusal: for data its caller knows may
    /// have been made under other keys, and which it then tells apart itself (a read adopted
    /// by TASK REASSIGN at ErrorRecoveryLevel 2 may bring Data-In the target sealed for the
    /// failed connection). Refuses exactly what `inbound` refuses. The default is `inbound`.
    fn inbound_quiet(&self, cmd: CommandInfo, data: BytesMut) -> TransformFuture<BytesMut> {
        self.inbound(cmd, data)
    }
}

/// The identity transform: what `seal=none` means, and a reference for implementors.
#[derive(Debug, Default, Clone, Copy)]
pub struct Identity;

impl PayloadTransform for Identity {
    fn wire_len(&self, plain_len: usize) -> Option<usize> {
        Some(plain_len)
    }
    fn outbound(&self, _cmd: CommandInfo, data: Bytes) -> TransformFuture<Bytes> {
        Box::pin(async move { Ok(data) })
    }
    fn outbound_now(&self, _cmd: CommandInfo, data: &Bytes) -> Option<Result<Bytes>> {
        Some(Ok(data.clone()))
    }
    fn inbound(&self, _cmd: CommandInfo, data: BytesMut) -> TransformFuture<BytesMut> {
        Box::pin(async move { Ok(data) })
    }
}
