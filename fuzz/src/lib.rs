//! Fuzz harnesses for ipsan (issue 8), one function per target, one module per family of
//! targets (`pdu`, `login`, `scsi`, `seal`, `wan`, `engine`, `nvme`), re-exported here; the
//! input reader they share (`Input`) is here.
//!
//! Each harness takes arbitrary bytes, drives one sans-IO component with them and checks
//! properties that must hold for *every* input (not only "does not panic"):
//!
//! | harness | component | properties |
//! |---|---|---|
//! | [`pdu_decode`] | `iscsi_wire::Codec::decode` (RFC 7143 §11.2) | never consumes more than it was given; `Ok(None)` consumes nothing; a decoded PDU re-encodes and decodes to the same header and segments; errors that leave the stream intact carry the offending BHS |
//! | [`nvme_pdu`] | `nvme_wire::pdu::Codec` (NVMe/TCP 1.0 §3.6.2), `entry::Sqe::check_tcp`, `fabrics` | consumes exactly PLEN or nothing; a decoded PDU re-encodes to the same bytes (and so do Fabrics commands and Connect data inside capsules); a fatal error yields a termination request that round-trips; a non-fatal one consumed its PDU and names a completion status |
//! | [`nvme_controller`] | `nvme_proto::controller::Target`/`Queue` (NVMe over Fabrics 1.1 §3, NVMe Base 2.0 §5, NVM Command Set 1.0 §3) | arbitrary Connects (plain or on a TLS channel keyed for some NQNs), admin/I/O commands, block results in any order, namespace changes, disconnects and time never panic; a TLS connection never connects as NQNs its PSK identity does not name; a completion answers its own CID with no more data than its SGL; block requests stay inside their namespace with tags unique per queue; a command completes exactly at its last block result; no keep-alive deadline is left in the past |
//! | [`text_negotiate`] | `iscsi_wire::text`, `iscsi_proto::params` (RFC 7143 §6.1, §6.2, §13) | encode∘parse round-trips; a responder's answer always passes the originator's check |
//! | [`initiator_login`] | `iscsi_proto::login::originator::LoginMachine` through `LoginExchange` (RFC 7143 §6.3, §12.1.3) | arbitrary Login Responses never complete a mutual-CHAP login, never drop a digest we insisted on, never yield parameters outside RFC 7143 §13's ranges; no request we would send carries a secret |
//! | [`login_sm`] | `iscsi_proto::login::TargetLogin` (RFC 7143 §6.3, §12.1.3) | a sequence of arbitrary Login PDUs never reaches full feature phase on a CHAP target (the fuzzer cannot know the challenge), nor on any target after a failure |
//! | [`cdb_dispatch`] | `ipsan_scsi::cdb::parse`, `cdb::decode`, `LogicalUnit::execute`, `execute_decoded` (SPC-4, SBC-4) | CHECK CONDITION iff sense; Data-In never exceeds the allocation length the CDB allows, the typed command's `data_in_len` or the LU's size; the typed command's extent is Seal's; `execute_decoded` answers as `execute` |
//! | [`seal_open`] | `ipsan_seal::SealSession::open` | nothing but what the peer sealed under the same binding opens: arbitrary bytes, a flipped bit, another binding or a replay are all refused |
//! | [`engine_pdu`] | `iscsi_proto::engine::{target, initiator}::Connection::handle_pdu` (RFC 7143 §4.2, §11) | target: R2Ts never carry the reserved TTT, StatSN runs in sequence, Data-In respects MaxRecvDataSegmentLength, DataSN and offsets; initiator: every command completes at most once (exactly once after the connection ends), Data-Out stays in the buffer and under the target's MaxRecvDataSegmentLength |
//! | [`seal_record`] | `ipsan_seal::record` (docs/seal.md §4a) | a sealed PDU stream after one bit flip, drop, duplicate or swap, read by `read_pdu` (verify, then decode): every PDU the opener accepts is the genuine PDU at that position (header, AHS and every MACed byte); arbitrary frames never verify under a fresh opener |
//! | [`seal_login`] | `ipsan_seal::negotiate` with CPace (docs/seal.md §2-§3) | target: arbitrary Seal login keys (offers, shares, confirmations, in any order) never yield a sealed session, and no answer carries the secret; initiator: a genuine target answer after arbitrary edits is accepted only if every Seal value in it parses to the genuine one, and then both sides hold the same keys |
//! | [`wan_model`] | `ipsan_wan::Impairment` (Dummynet pipe + netem pathologies) | release never precedes arrival; in-order packets leave in order; the queue never exceeds its limit; corruption flips exactly one bit |
//!
//! The same functions run as plain `cargo test` over the seed corpus and seeded random inputs
//! (`tests/corpus.rs`), so the properties are checked on stable Rust too.

mod engine;
mod login;
mod nvme;
mod pdu;
mod scsi;
mod seal;
mod wan;

pub use engine::*;
pub use login::*;
pub use nvme::*;
pub use pdu::*;
pub use scsi::*;
pub use seal::*;
pub use wan::*;

/// Reads bytes off the front of the input; missing bytes read as zero.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.0.len())
    }
    /// A probability in [0, 1] from one byte, scaled down so rare events stay rare.
    fn prob(&mut self, max: f64) -> f64 {
        f64::from(self.u8()) / 255.0 * max
    }
}
