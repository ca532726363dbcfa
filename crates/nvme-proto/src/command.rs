//! The seam between an NVMe/TCP queue and the controller behind it: a queue turns PDUs into
//! [`Command`]s (NVMe/TCP 1.0 §3.3: a command capsule plus its in-capsule data or the H2CData
//! PDUs an R2T solicited) and [`Completion`]s back into PDUs (C2HData, then the response
//! capsule); the controller never sees a PDU and the queue never interprets an opcode.

use bytes::Bytes;
use nvme_wire::{Cqe, Sqe};

/// A command the transport has received in full: its submission queue entry and every byte
/// of data the host sends with it, in order (empty for commands that send none).
#[derive(Debug, Clone)]
pub struct Command {
    /// The 64-byte SQE (NVMe Base 2.0 §4.2).
    pub sqe: Sqe,
    /// Host-to-controller data: in-capsule data or the H2CData PDUs' payloads, concatenated.
    pub data: Bytes,
}

/// The controller's answer to one command.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The 16-byte CQE (NVMe Base 2.0 §4.6); its CID echoes the command's.
    pub cqe: Cqe,
    /// Controller-to-host data (empty for commands that return none); the transport sends it
    /// as C2HData PDUs, at most the command's SGL length, before the response capsule.
    pub data: Bytes,
}
