//! Fuzz harnesses for ipsan (issue 8), one function per target.
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

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

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

// ------------------------------------------------------------------------------- PDU decode

/// Frames PDUs out of arbitrary bytes with each digest setting and a limit chosen by the first
/// byte; see the module table for the properties.
pub fn pdu_decode(data: &[u8]) {
    use iscsi_wire::Codec;
    let Some((&sel, stream)) = data.split_first() else {
        return;
    };
    let codec = Codec {
        header_digest: sel & 1 != 0,
        data_digest: sel & 2 != 0,
        max_recv_data_segment_length: match sel >> 2 & 3 {
            0 => 512,
            1 => 8192,
            2 => 262_144,
            _ => 16_777_215,
        },
    };
    let mut buf = BytesMut::from(stream);
    // Each round consumes at least one PDU or stops, so this is bounded by the input length.
    loop {
        let before = buf.len();
        match codec.decode(&mut buf) {
            Ok(None) => {
                assert_eq!(buf.len(), before, "an incomplete PDU consumed bytes");
                break;
            }
            Ok(Some(pdu)) => {
                let used = before - buf.len();
                assert!(used >= iscsi_wire::BHS_LEN && used <= before);
                assert!(pdu.data.len() <= codec.max_recv_data_segment_length as usize);
                assert_eq!(pdu.ahs.len() % 4, 0);
                // Round trip: what we decoded encodes back to something that decodes the same.
                let mut out = BytesMut::new();
                let again = Codec {
                    max_recv_data_segment_length: 16_777_215,
                    ..codec.clone()
                };
                // Reserved or flag-dependent fields (a Data-In status without the S bit,
                // RFC 7143 §11.7.4) may be dropped on the way out, so the property is a fixed
                // point: what we write, read back and write again is byte-identical.
                if again.encode(&pdu, &mut out).is_ok() {
                    let first = out.clone();
                    let back = again
                        .decode(&mut out)
                        .expect("re-encoded PDU decodes")
                        .expect("re-encoded PDU is whole");
                    assert!(out.is_empty(), "re-encoded PDU fully consumed");
                    assert_eq!(back.header.opcode(), pdu.header.opcode());
                    assert_eq!(back.header.itt(), pdu.header.itt());
                    assert_eq!(back.ahs, pdu.ahs);
                    assert_eq!(back.data, pdu.data);
                    let mut second = BytesMut::new();
                    again.encode(&back, &mut second).expect("re-encodes");
                    assert_eq!(first, second, "encode/decode is not a fixed point");
                }
            }
            Err(e) => {
                if e.stream_intact() {
                    assert!(
                        buf.len() < before,
                        "an intact-stream error consumed the PDU"
                    );
                } else {
                    break;
                }
            }
        }
    }
}

// ------------------------------------------------------------------- text and negotiation

/// Parses a text segment, round-trips it, and resolves every known key against the target's
/// own offer; see the module table.
pub fn text_negotiate(data: &[u8]) {
    use iscsi_proto::params::{check_answer, resolve, spec, SessionParams, Side, REJECT};
    let Ok(pairs) = iscsi_wire::text::parse(data) else {
        return;
    };
    let enc = iscsi_wire::text::encode(&pairs);
    let back = iscsi_wire::text::parse(&enc).expect("encoded text parses");
    assert_eq!(back, pairs, "text round trip");
    let offer = iscsi_proto::login::TargetOffer::default();
    let mut params = SessionParams::default();
    for (k, v) in &pairs {
        let Some(s) = spec(k) else { continue };
        let ours = target_value(&offer, k);
        if let Ok(answer) = resolve(s, v, &ours) {
            if answer != REJECT {
                check_answer(s, v, &answer).unwrap_or_else(|e| {
                    panic!(
                        "responder answer {k}={answer} to {v:?} fails the originator's check: {e}"
                    )
                });
                params.apply(k, &answer, Side::Target);
            }
        }
        params.apply(k, v, Side::Initiator);
    }
    params.finish();
    assert!(params.first_burst_length <= params.max_burst_length);
    let _ = format!("{params:?}");
}

/// The target's own value for a key (as `TargetOffer` would answer).
fn target_value(o: &iscsi_proto::login::TargetOffer, key: &str) -> String {
    let yn = |b: bool| if b { "Yes" } else { "No" }.to_owned();
    match key {
        "HeaderDigest" => o.header_digest.into(),
        "DataDigest" => o.data_digest.into(),
        "InitialR2T" => yn(o.initial_r2t),
        "ImmediateData" => yn(o.immediate_data),
        "MaxBurstLength" => o.max_burst_length.to_string(),
        "FirstBurstLength" => o.first_burst_length.to_string(),
        "MaxOutstandingR2T" => o.max_outstanding_r2t.to_string(),
        "MaxRecvDataSegmentLength" => o.max_recv_data_segment_length.to_string(),
        "DataPDUInOrder" | "DataSequenceInOrder" => "Yes".into(),
        "IFMarker" | "OFMarker" => "No".into(),
        "DefaultTime2Wait" => "2".into(),
        "DefaultTime2Retain" => "20".into(),
        "iSCSIProtocolLevel" => "1".into(),
        _ => "1".into(),
    }
}

// --------------------------------------------------------------------------- login machine

/// A directory with one CHAP target, one open target and CHAP-protected discovery.
struct Dir;

/// The CHAP-protected target's name.
pub const CHAP_TARGET: &str = "iqn.2026-11.org.ipsan:fuzz-chap";
/// The open target's name.
pub const OPEN_TARGET: &str = "iqn.2026-11.org.ipsan:fuzz-open";

fn chap_policy() -> iscsi_proto::login::ChapPolicy {
    use iscsi_proto::chap::{ChapAlgorithm, ChapSecret};
    iscsi_proto::login::ChapPolicy {
        user: "fuzz".into(),
        secret: ChapSecret::new(b"fuzz-secret-16bytes".to_vec()).expect("valid secret"),
        mutual: None,
        algorithms: vec![
            ChapAlgorithm::SHA256,
            ChapAlgorithm::SHA1,
            ChapAlgorithm::MD5,
        ],
    }
}

impl iscsi_proto::login::Directory for Dir {
    fn target(
        &self,
        target_name: &str,
        _initiator_name: &str,
    ) -> Result<iscsi_proto::login::TargetPolicy, iscsi_proto::login::LoginFailure> {
        use iscsi_proto::login::{Auth, LoginFailure, LoginStatus, TargetPolicy};
        let auth = match target_name {
            CHAP_TARGET => Auth::Chap(chap_policy()),
            OPEN_TARGET => Auth::None,
            _ => return Err(LoginFailure::new(LoginStatus::NOT_FOUND, "no such target")),
        };
        Ok(TargetPolicy {
            auth,
            portal_group_tag: 1,
            alias: None,
        })
    }
    fn discovery(
        &self,
        _initiator_name: &str,
    ) -> Result<iscsi_proto::login::TargetPolicy, iscsi_proto::login::LoginFailure> {
        Ok(iscsi_proto::login::TargetPolicy {
            auth: iscsi_proto::login::Auth::Chap(chap_policy()),
            portal_group_tag: 1,
            alias: None,
        })
    }
    fn assign_tsih(
        &mut self,
        _isid: [u8; 6],
        _initiator_name: &str,
        requested: u16,
    ) -> Result<u16, iscsi_proto::login::LoginFailure> {
        Ok(if requested == 0 { 7 } else { requested })
    }
}

/// Decodes a stream of PDUs and feeds every Login Request to one `TargetLogin`, as the
/// target's login phase does; see the module table for the properties.
pub fn login_sm(data: &[u8]) {
    use iscsi_proto::login::{Outcome, TargetLogin, TargetOffer};
    use iscsi_wire::{Codec, Header};
    let mut login = TargetLogin::new(TargetOffer::default(), None);
    let codec = Codec::default();
    let mut buf = BytesMut::from(data);
    let mut failed = false;
    let mut dir = Dir;
    while let Ok(Some(pdu)) = codec.decode(&mut buf) {
        let Header::LoginRequest(req) = &pdu.header else {
            continue;
        };
        let reply = login.handle(req, &pdu.data, &mut dir);
        // The response must be encodable and carry a parsable text segment.
        let mut out = BytesMut::new();
        let resp = iscsi_wire::Pdu::new(reply.header.clone(), Bytes::from(reply.data.clone()));
        codec
            .encode(&resp, &mut out)
            .expect("login response encodes");
        if !reply.data.is_empty() {
            iscsi_wire::text::parse(&reply.data).expect("login response text parses");
        }
        match reply.outcome {
            Outcome::Continue => {
                assert_eq!(reply.header.status_class, 0);
            }
            Outcome::Failed(_) => {
                assert_ne!(
                    reply.header.status_class, 0,
                    "a failure has a failure status"
                );
                failed = true;
            }
            Outcome::FullFeature(result) => {
                assert!(!failed, "full feature phase after a failed login");
                let p = &result.params;
                assert_ne!(
                    p.target_name.as_deref(),
                    Some(CHAP_TARGET),
                    "CHAP target reached without knowing the challenge"
                );
                assert_ne!(
                    p.session_type,
                    iscsi_proto::params::SessionType::Discovery,
                    "CHAP-protected discovery reached without knowing the challenge"
                );
                assert!(p.first_burst_length <= p.max_burst_length);
                assert!(!p.initiator_name.is_empty(), "InitiatorName is required");
            }
            // This directory configures no relayed CHAP (`Auth::Relay`), so the engine must
            // never ask the driver to relay.
            Outcome::Relay(_) => panic!("CHAP relay requested by a target that relays nothing"),
        }
    }
}

// ------------------------------------------------------------------ initiator login machine

/// The secret our initiator answers CHAP with, and the one it expects mutual CHAP to prove.
const INI_SECRET: &[u8] = b"fuzz-initiator-secret";
const INI_MUTUAL_SECRET: &[u8] = b"fuzz-mutual-target-secret";

/// The initiator's side of login: [`iscsi_proto::login::originator::LoginMachine`] (RFC 7143 §6.3,
/// §12.1.3) fed arbitrary Login Responses through `LoginExchange`, the PDU layer the initiator
/// logs in with (C-bit reassembly, the 64 KiB text cap, the requests it would send). The first byte picks the options: bits 0–1 CHAP (none, one-way,
/// mutual, mutual), bits 2–3 the digests we insist on, bit 4 a discovery session.
///
/// Properties: with mutual CHAP the login never completes (the target would have to answer
/// our random challenge); a completed login has every digest we insisted on (no silent
/// fallback), ErrorRecoveryLevel 0, in-order data, bursts in 512..2^24 with FirstBurstLength ≤
/// MaxBurstLength, a target MaxRecvDataSegmentLength in 512..2^24 and our own declared one;
/// no step we would send carries either secret, as text or hex.
pub fn initiator_login(data: &[u8]) {
    use iscsi_proto::chap::ChapSecret;
    use iscsi_proto::login::originator::{
        ChapCredentials, DigestChoice, LoginExchange, LoginMachine, LoginOptions, LoginProgress,
        SessionKind,
    };
    use iscsi_wire::Codec;
    let Some((&sel, stream)) = data.split_first() else {
        return;
    };
    let cred = |name: &str, secret: &[u8]| ChapCredentials {
        name: name.into(),
        secret: ChapSecret::new(secret.to_vec()).expect("valid secret"),
    };
    let mut opts = LoginOptions::default();
    let mutual = sel & 3 >= 2;
    if sel & 3 != 0 {
        opts.chap = Some(cred("fuzz-ini", INI_SECRET));
    }
    if mutual {
        opts.mutual_chap = Some(cred("fuzz-tgt", INI_MUTUAL_SECRET));
    }
    opts.digest = match sel >> 2 & 3 {
        0 => DigestChoice::None,
        1 => DigestChoice::Header,
        2 => DigestChoice::Data,
        _ => DigestChoice::Both,
    };
    let kind = if sel & 0x10 != 0 {
        SessionKind::Discovery
    } else {
        SessionKind::Normal {
            target_name: OPEN_TARGET.into(),
        }
    };
    let declared = opts.max_recv_data_segment_length;
    let secrets: Vec<String> = [INI_SECRET, INI_MUTUAL_SECRET]
        .iter()
        .flat_map(|s| [String::from_utf8_lossy(s).into_owned(), hex_lower(s)])
        .collect();
    let no_secret = |keys: &[(String, String)]| {
        for (k, v) in keys {
            let v = v.to_ascii_lowercase();
            for s in &secrets {
                assert!(!v.contains(s.as_str()), "{k} carries a CHAP secret");
            }
        }
    };
    let (machine, first) = <LoginMachine>::start(opts.clone(), kind);
    // The initiator's own PDU layer: C-bit reassembly, the 64 KiB text cap, the requests.
    let mut x = LoginExchange::new(machine, first, [0x80, 0, 0, 0, 0, 1]);
    // Login PDUs are limited to 8192 bytes until the operational values apply (§13.12).
    let codec = Codec::default();
    let mut buf = BytesMut::from(stream);
    for _ in 0..64 {
        while let Some(req) = x.poll_transmit() {
            let keys = iscsi_wire::text::parse(&req.data).expect("our request text parses");
            no_secret(&keys);
        }
        let Ok(Some(pdu)) = codec.decode(&mut buf) else {
            return;
        };
        match x.handle_pdu(&pdu) {
            Err(e) => {
                let _ = e.to_string();
                return;
            }
            Ok(LoginProgress::Send) => {}
            // Only a login started with `start_relayed` hands a challenge to its caller.
            Ok(LoginProgress::RelayChallenge { .. }) => {
                panic!("a relay challenge from a login that was not started relayed")
            }
            Ok(LoginProgress::Done(done)) => {
                let n = &done.established.params;
                assert!(
                    !mutual,
                    "mutual CHAP login completed without the target's proof"
                );
                assert!(
                    !opts.digest.header() || n.header_digest,
                    "HeaderDigest fell back"
                );
                assert!(!opts.digest.data() || n.data_digest, "DataDigest fell back");
                assert_eq!(n.error_recovery_level, 0);
                assert!(n.data_pdu_in_order && n.data_sequence_in_order);
                let range = 512..=16_777_215;
                assert!(range.contains(&n.max_burst_length), "{n:?}");
                assert!(range.contains(&n.first_burst_length), "{n:?}");
                assert!(n.first_burst_length <= n.max_burst_length, "{n:?}");
                assert!(
                    range.contains(&n.target_max_recv_data_segment_length),
                    "{n:?}"
                );
                assert_eq!(n.initiator_max_recv_data_segment_length, declared);
                assert!(n.max_outstanding_r2t >= 1);
                return;
            }
        }
    }
}

fn hex_lower(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

// ---------------------------------------------------------------------------- SCSI dispatch

/// Builds a fresh 1 MiB RAM LU and runs one CDB on it with as much Data-Out as the CDB asks
/// for (the target's contract); see the module table.
pub fn cdb_dispatch(data: &[u8]) {
    use ipsan_scsi::lu::{LuConfig, ScsiRequest};
    use ipsan_scsi::{DataDirection, LogicalUnit, NexusId};
    let mut inp = Input(data);
    let sel = inp.u8();
    let cdb_len = [6usize, 10, 12, 16, 32][usize::from(sel % 5)];
    let cdb = inp.bytes(cdb_len).to_vec();
    let payload = inp.rest();
    // Parse on its own must not panic.
    let _ = ipsan_scsi::cdb::parse(&cdb);
    let mut cfg = LuConfig::with_serial("fuzz0001");
    cfg.block_size = if sel & 0x80 != 0 { 4096 } else { 512 };
    cfg.write_cache = sel & 0x40 != 0;
    cfg.power_on_ua = false;
    let backend: Arc<dyn ipsan_scsi::Backend> =
        Arc::new(ipsan_scsi::backend::MemBackend::new(1 << 20));
    let Ok(lu) = LogicalUnit::new(backend, cfg) else {
        return;
    };
    let info = lu.command_info(&cdb);
    // The typed command agrees with the lenient readers Seal and the metrics use, and with
    // the one opcode table.
    if let Ok(info) = &info {
        assert_eq!(info.opcode, cdb[0]);
        assert_eq!(info.extent, ipsan_scsi::cdb::extent(&cdb), "Seal's extent");
        assert_eq!(ipsan_scsi::cdb::entry(cdb[0]), Some(info.op));
        assert_eq!(info.family(), ipsan_scsi::cdb::family(&cdb));
        assert!(info.data_out_len == 0 || info.direction == DataDirection::Write);
        assert!(info.data_in_len == 0 || info.direction == DataDirection::Read);
    }
    let need = match &info {
        Ok(info) if info.direction == DataDirection::Write => info.data_out_len,
        Ok(_) => 0,
        Err(_) => 0,
    };
    // The target refuses commands over 64 MiB before collecting data; a 1 MiB LU needs less.
    if need > 4 << 20 {
        return;
    }
    let mut data_out = vec![0u8; need as usize];
    if !payload.is_empty() {
        for (i, b) in data_out.iter_mut().enumerate() {
            *b = payload[i % payload.len()];
        }
    }
    let nexus = NexusId("iqn.2026-11.org.ipsan:fuzz,i,0x800000000001".into());
    let req = ScsiRequest {
        cdb: &cdb,
        data_out: &data_out,
        nexus: &nexus,
        lun: 0,
        tailroom: false,
    };
    // A command decoded once answers as one the LU parses itself (on a twin LU: the command
    // may change what it stores).
    if let (Ok(info), Ok(twin)) = (
        &info,
        LogicalUnit::new(
            Arc::new(ipsan_scsi::backend::MemBackend::new(1 << 20)),
            lu.config().clone(),
        ),
    ) {
        let decoded = twin.execute_decoded(&req, info);
        let parsed = lu.execute(&req);
        assert_eq!(decoded, parsed, "execute_decoded and execute differ");
        return check_answer(&cdb, Some(info), &parsed);
    }
    let resp = lu.execute(&req);
    check_answer(&cdb, info.as_ref().ok(), &resp);
}

/// What every answer of the LU to `cdb` must satisfy.
fn check_answer(
    cdb: &[u8],
    info: Option<&ipsan_scsi::CommandInfo>,
    resp: &ipsan_scsi::ScsiResponse,
) {
    use ipsan_scsi::ScsiStatus;
    assert_eq!(
        resp.status == ScsiStatus::CHECK_CONDITION,
        resp.sense.is_some(),
        "CHECK CONDITION iff sense"
    );
    if let Some(s) = &resp.sense {
        let fixed = s.to_fixed();
        assert!(fixed.len() >= 18 && fixed.len() <= 252);
    }
    // Data-In is bounded by the LU and by the CDB's transfer/allocation length field.
    assert!(resp.data_in.len() <= (1 << 20) + 64 * 1024);
    if resp.status != ScsiStatus::GOOD {
        return;
    }
    if let Some(info) = info {
        assert!(
            resp.data_in.len() as u64 <= info.data_in_len,
            "opcode {:#04x}: {} bytes of Data-In over the {} the typed command allows",
            cdb[0],
            resp.data_in.len(),
            info.data_in_len
        );
    }
    if let Some(alloc) = allocation_length(cdb) {
        assert!(
            resp.data_in.len() as u64 <= alloc,
            "opcode {:#04x}: {} bytes of Data-In over the {} the CDB allows",
            cdb[0],
            resp.data_in.len(),
            alloc
        );
    }
}

/// The allocation length of the data-in commands whose field sits at a fixed place (SPC-4).
fn allocation_length(cdb: &[u8]) -> Option<u64> {
    let be = |r: std::ops::Range<usize>| {
        cdb.get(r)
            .map(|b| b.iter().fold(0u64, |a, &x| a << 8 | u64::from(x)))
    };
    match *cdb.first()? {
        // INQUIRY, MODE SENSE(10), LOG SENSE, PERSISTENT RESERVE IN: 2 bytes at 3 / 7.
        0x12 => be(3..5),
        0x5a | 0x4d | 0x5e => be(7..9),
        // MODE SENSE(6), REQUEST SENSE: 1 byte at 4.
        0x1a | 0x03 => be(4..5),
        // REPORT LUNS: 4 bytes at 6.
        0xa0 => be(6..10),
        _ => None,
    }
}

// ------------------------------------------------------------------------------- seal login

/// The secret both honest sides hold in [`seal_login`].
const LOGIN_SECRET: &[u8] = b"fuzz-pre-shared-secret-0123456789";

/// The Seal login exchange (CPace under the key schedule) with arbitrary keys on either side;
/// see the module table. Byte 0: bit 0 picks the side (0: fuzz the initiator's requests to a
/// real target, 1: fuzz the real target's answer to a real initiator), bits 1-2 the policy or
/// cipher. Target side: the rest is up to three text segments separated by 0xff, each the
/// Seal keys of one Login Request. Initiator side: (offset u16, byte) edits of the genuine
/// answer's text, or (if bit 3) the rest as the whole answer.
pub fn seal_login(data: &[u8]) {
    use ipsan_seal::negotiate::{KEY_CHUNK, KEY_CONFIRM, KEY_NONCE, KEY_SEAL, KEY_SHARE};
    use ipsan_seal::{
        AnswerOutcome, Cipher, LoginTranscript, Psk, SealAnswer, SealOffer, SealPolicy, SessionIds,
        TargetNegotiation, TargetSealConfig,
    };
    let mut inp = Input(data);
    let sel = inp.u8();
    let ids = SessionIds {
        initiator_name: "iqn.2026-11.org.ipsan:fuzz-i".into(),
        target_name: "iqn.2026-11.org.ipsan:fuzz-t".into(),
        isid: [0x80, 0, 0, 0, 0, 1],
    };
    let psk = || Psk::new(LOGIN_SECRET.to_vec()).expect("long enough");
    if sel & 1 == 0 {
        let policy = [SealPolicy::Off, SealPolicy::Allowed, SealPolicy::Required]
            [usize::from(sel >> 1 & 3) % 3];
        let mut t = TargetNegotiation::new(
            TargetSealConfig {
                policy,
                ..TargetSealConfig::default()
            },
            Box::new(move |_| Some(psk())),
        );
        let transcript = LoginTranscript::new();
        let hex_secret = hex::encode(LOGIN_SECRET);
        for seg in inp.rest().split(|b| *b == 0xff).take(3) {
            let Ok(keys) = iscsi_wire::text::parse(seg) else {
                break;
            };
            let keys: Vec<_> = keys
                .into_iter()
                .filter(|(k, _)| ipsan_seal::is_seal_key(k))
                .collect();
            match t.respond(&keys, &ids, &transcript) {
                Ok(out) => {
                    for (_, v) in &out {
                        assert!(
                            !v.as_bytes()
                                .windows(LOGIN_SECRET.len())
                                .any(|w| w == LOGIN_SECRET)
                                && !v.contains(&hex_secret),
                            "an answer carries the secret"
                        );
                    }
                }
                Err(_) => break,
            }
        }
        if t.finish(&ids).is_ok() {
            assert!(
                t.take_session().is_none(),
                "a sealed session for a peer that never knew the CPace scalar"
            );
        }
        return;
    }
    // Initiator side: a real offer, the real target's answer, then edits.
    let cipher =
        [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305, Cipher::None][usize::from(sel >> 1 & 3) % 3];
    let Ok(offer) = SealOffer::new(vec![cipher], 65536, psk(), ids.clone()) else {
        return;
    };
    let Ok(AnswerOutcome::Pending(pending)) =
        SealAnswer::handle_offer(&TargetSealConfig::default(), &offer.keys(), &ids, |_| {
            Some(psk())
        })
    else {
        panic!("the real target refused a real offer");
    };
    let genuine = pending.keys().to_vec();
    let mut text: Vec<u8> = genuine
        .iter()
        .flat_map(|(k, v)| format!("{k}={v}\0").into_bytes())
        .collect();
    if sel & 8 != 0 {
        text = inp.rest().to_vec();
    } else {
        while !inp.0.is_empty() && !text.is_empty() {
            let at = usize::from(inp.u16()) % text.len();
            text[at] = inp.u8();
        }
    }
    let Ok(answer) = iscsi_wire::text::parse(&text) else {
        return;
    };
    let Ok((session, confirm)) = offer.handle_answer(&answer) else {
        return;
    };
    // Accepted: every Seal value must be the genuine one (RFC 7143 §6.1 lets the hex digits
    // change case and the number gain leading zeros, nothing else).
    let last = |keys: &[(String, String)], k: &str| {
        keys.iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let hexv = |v: String| hex::decode(v.get(2..).unwrap_or("")).ok();
    assert_eq!(last(&answer, KEY_SEAL), last(&genuine, KEY_SEAL));
    assert_eq!(
        last(&answer, KEY_CHUNK).parse::<u32>().ok(),
        last(&genuine, KEY_CHUNK).parse::<u32>().ok()
    );
    for k in [KEY_NONCE, KEY_SHARE, KEY_CONFIRM] {
        assert_eq!(
            hexv(last(&answer, k)),
            hexv(last(&genuine, k)),
            "{k} accepted though edited"
        );
    }
    let target = pending
        .handle_confirm(&confirm)
        .expect("the target accepts the initiator's confirmation");
    assert_eq!(session.cipher(), target.cipher());
    assert_eq!(session.chunk_size(), target.chunk_size());
}

// -------------------------------------------------------------------------------- seal open

/// Opens arbitrary bytes, and a genuine sealed command after one mutation, under a fresh
/// session pair; see the module table.
pub fn seal_open(data: &[u8]) {
    use ipsan_seal::{Binding, Cipher};
    let mut inp = Input(data);
    let sel = inp.u8();
    let cipher = match sel & 3 {
        0 => Cipher::Aes256Gcm,
        1 => Cipher::ChaCha20Poly1305,
        2 => Cipher::TripleDesCbcHmacSha1,
        _ => Cipher::Aes256Gcm,
    };
    let chunk = [512u32, 4096, 65536][usize::from(sel >> 2) % 3];
    let Some((init, target)) = seal_pair(cipher, chunk) else {
        return;
    };
    let binding = Binding {
        lun: u64::from(inp.u8()),
        lba: u64::from(inp.u32()),
        blocks: u32::from(inp.u8()),
        opcode: 0x8a,
        task_tag: inp.u32(),
    };
    let mode = inp.u8();
    let at = usize::from(inp.u16());
    let body = inp.rest();
    // 1. Arbitrary bytes never open (empty input is zero chunks: nothing to forge; the
    // runtimes check the transfer length against the CDB before opening).
    if !body.is_empty() {
        assert!(
            target.open(&binding, BytesMut::from(body)).is_err(),
            "forged sealed data opened"
        );
    }
    // 2. A genuine command opens once; mutated, re-bound or replayed it does not.
    let plain = &body[..body.len().min(3 * chunk as usize)];
    let Ok(sealed) = init.seal(&binding, BytesMut::from(plain)) else {
        return;
    };
    if sealed.is_empty() {
        return;
    }
    match mode % 4 {
        0 => {
            let mut bad = BytesMut::from(&sealed[..]);
            let i = at % bad.len();
            bad[i] ^= 1 << (mode >> 5);
            assert!(target.open(&binding, bad).is_err(), "bit flip accepted");
        }
        1 => {
            let other = Binding {
                lba: binding.lba.wrapping_add(1),
                ..binding
            };
            assert!(
                target.open(&other, BytesMut::from(&sealed[..])).is_err(),
                "relocated data accepted"
            );
        }
        2 => {
            let cut = 1 + at % sealed.len().saturating_sub(1).max(1);
            assert!(
                cut >= sealed.len()
                    || target
                        .open(&binding, BytesMut::from(&sealed[..cut]))
                        .is_err(),
                "truncated data accepted"
            );
        }
        _ => {}
    }
    let opened = target
        .open(&binding, BytesMut::from(&sealed[..]))
        .expect("genuine data opens");
    assert_eq!(&opened[..], plain);
    assert!(
        target.open(&binding, BytesMut::from(&sealed[..])).is_err(),
        "replay accepted"
    );
}

// ------------------------------------------------------------------------------ seal record

/// Builds PDUs from the input, protects them with a record sealer, mutates the wire stream
/// once (bit flip, drop, duplicate or swap of whole PDUs) and checks that the opener accepts
/// only a prefix of the genuine stream; see the module table.
pub fn seal_record(data: &[u8]) {
    use ipsan_seal::record::{data_is_sealed_transfer, pair_for_test};
    use ipsan_seal::Cipher;
    use iscsi_wire::{Codec, Header, Pdu};
    let mut inp = Input(data);
    let sel = inp.u8();
    let cipher = match sel % 3 {
        0 => Cipher::Aes256Gcm,
        1 => Cipher::ChaCha20Poly1305,
        _ => Cipher::TripleDesCbcHmacSha1,
    };
    let mode = inp.u8();
    let at = usize::from(inp.u16());
    let codec = Codec::default();
    let (mut sealer, _) = pair_for_test(cipher, sel);
    // PDUs: a BHS from the input (kept only if it parses), then up to 255 data bytes.
    let mut frames: Vec<Vec<u8>> = Vec::new();
    while frames.len() < 6 && inp.0.len() >= 49 {
        let mut bhs = [0u8; 48];
        for b in &mut bhs {
            *b = inp.u8();
        }
        let n = usize::from(inp.u8());
        let body = inp.0.get(..n.min(inp.0.len())).unwrap_or_default().to_vec();
        inp.0 = &inp.0[body.len()..];
        bhs[4] = 0;
        let Ok(header) = Header::parse(&bhs) else {
            continue;
        };
        let mut pdu = Pdu::new(header, Bytes::from(body));
        if sealer.protect(&mut pdu).is_err() {
            return;
        }
        let mut out = BytesMut::new();
        if codec.encode(&pdu, &mut out).is_err() {
            return;
        }
        frames.push(out.to_vec());
    }
    let decode_all = |wire: &[u8]| {
        let mut buf = BytesMut::from(wire);
        let mut v = Vec::new();
        while let Ok(Some(p)) = codec.decode(&mut buf) {
            v.push(p);
        }
        v
    };
    let genuine = decode_all(&frames.concat());
    // One mutation of the stream.
    let mut mutated = frames.clone();
    let k = if frames.is_empty() {
        0
    } else {
        at % frames.len()
    };
    let changed = match mode % 5 {
        0 if !frames.is_empty() => {
            let f = &mut mutated[k];
            let i = (at / 7) % f.len();
            f[i] ^= 1 << (mode >> 5);
            true
        }
        1 if !frames.is_empty() => {
            mutated.remove(k);
            true
        }
        2 if !frames.is_empty() => {
            mutated.insert(k, frames[k].clone());
            true
        }
        3 if frames.len() > 1 && k + 1 < frames.len() => {
            mutated.swap(k, k + 1);
            true
        }
        _ => false,
    };
    // The receiver's framed read, as both roles run it: verify, then decode.
    let (_, mut opener) = pair_for_test(cipher, sel);
    let mut accepted = 0usize;
    let mut refused = false;
    let mut buf = BytesMut::from(&mutated.concat()[..]);
    loop {
        let p = match ipsan_seal::read_pdu(&codec, Some(&mut opener), &mut buf) {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(_) => {
                refused = true;
                break;
            }
        };
        let raw = *p.raw_bhs();
        let g = &genuine[accepted];
        assert_eq!(raw, *g.raw_bhs(), "an altered header verified");
        assert_eq!(
            p.ahs.len() + ipsan_seal::record::SEAL_AHS_LEN,
            g.ahs.len(),
            "an altered AHS verified"
        );
        if data_is_sealed_transfer(raw[0]) {
            assert_eq!(p.data.len(), g.data.len(), "an altered length verified");
        } else {
            assert_eq!(p.data, g.data, "altered data verified");
        }
        accepted += 1;
    }
    // A duplicate or a swap is refused when it arrives; a drop when the next PDU arrives
    // (a dropped last PDU shows only when a later one comes: the keepalive, docs/seal.md §4a).
    let dropped_last = mode % 5 == 1 && k + 1 == frames.len();
    if changed && matches!(mode % 5, 1..=3) && !dropped_last {
        assert!(
            refused,
            "a dropped, duplicated or swapped PDU went unnoticed"
        );
    }
    if !changed {
        assert_eq!(accepted, genuine.len(), "a genuine stream was refused");
    }
    // Arbitrary bytes as a frame never verify under a fresh opener, whatever they hold.
    let (_, mut fresh) = pair_for_test(cipher, sel.wrapping_add(1));
    let r = ipsan_seal::read_pdu(&codec, Some(&mut fresh), &mut BytesMut::from(data));
    assert!(!matches!(r, Ok(Some(_))), "an arbitrary frame verified");
}

/// A negotiated (initiator, target) pair, through the real login key exchange.
pub fn seal_pair(
    cipher: ipsan_seal::Cipher,
    chunk: u32,
) -> Option<(ipsan_seal::SealSession, ipsan_seal::SealSession)> {
    use ipsan_seal::{AnswerOutcome, Psk, SealAnswer, SealOffer, SessionIds, TargetSealConfig};
    let ids = SessionIds {
        initiator_name: "iqn.2026-11.org.ipsan:fuzz-ini".into(),
        target_name: "iqn.2026-11.org.ipsan:fuzz-tgt".into(),
        isid: [0x80, 0, 0, 0, 0, 1],
    };
    let psk = || Psk::new(b"fuzzing pre-shared key, 32 bytes".to_vec()).ok();
    let offer = SealOffer::new(vec![cipher], chunk, psk()?, ids.clone()).ok()?;
    let cfg = TargetSealConfig {
        accept: vec![cipher],
        ..TargetSealConfig::default()
    };
    let AnswerOutcome::Pending(pending) =
        SealAnswer::handle_offer(&cfg, &offer.keys(), &ids, |_| psk()).ok()?
    else {
        return None;
    };
    let (init, confirm) = offer.handle_answer(pending.keys()).ok()?;
    let target = pending.handle_confirm(&confirm).ok()?;
    Some((init, target))
}

// ------------------------------------------------------------------------------- WAN model

/// Runs a packet sequence through one direction's impairment model with settings taken from
/// the input; see the module table.
pub fn wan_model(data: &[u8]) {
    use ipsan_wan::{DirConfig, Impairment, LossModel, Packet, QueueLimit, Stage, Verdict};
    use std::time::Duration;
    let mut inp = Input(data);
    let kind = inp.u8();
    let loss = match kind % 3 {
        0 => LossModel::None,
        1 => LossModel::Bernoulli { p: inp.prob(1.0) },
        _ => LossModel::Gilbert {
            p: inp.prob(1.0),
            r: inp.prob(1.0),
            loss_bad: inp.prob(1.0),
            loss_good: inp.prob(0.1),
        },
    };
    let queue_limit = u32::from(inp.u8()) + 1;
    let cfg = DirConfig {
        delay: Duration::from_micros(u64::from(inp.u16()) * 10),
        jitter: Duration::from_micros(u64::from(inp.u16())),
        jitter_dist: if kind & 0x80 != 0 {
            ipsan_wan::JitterDist::Normal
        } else {
            ipsan_wan::JitterDist::Uniform
        },
        loss,
        reorder: inp.prob(0.5),
        reorder_gap: Duration::from_micros(u64::from(inp.u16())),
        corrupt: inp.prob(0.5),
        duplicate: inp.prob(0.5),
        rate_bps: u64::from(inp.u32()) * 8,
        queue: QueueLimit::Packets(queue_limit),
        cuts: Vec::new(),
    };
    if cfg.validate().is_err() {
        return;
    }
    let seed = u64::from(inp.u32());
    let mut m = Impairment::new(cfg.clone(), seed);
    let mut now: u64 = 0;
    let mut last_in_order = 0u64;
    let mut p = Packet::with_capacity(1600);
    for _ in 0..2048 {
        if inp.0.len() < 3 {
            break;
        }
        now += u64::from(inp.u8()) * 1000;
        let len = usize::from(inp.u16() % 1500) + 1;
        let fill = inp.u8();
        let orig = vec![fill; len];
        p.buffer_mut()[..len].copy_from_slice(&orig);
        p.set_len(len);
        p.reset(now);
        let v = m.process(now, &mut p);
        assert!(
            m.queue_len(now) <= queue_limit as usize || cfg.rate_bps == 0,
            "queue over its limit"
        );
        if v != Verdict::Pass {
            continue;
        }
        assert!(p.release_at >= now, "released before it arrived");
        if !p.reordered {
            assert!(p.release_at >= last_in_order, "in-order packets overtook");
            last_in_order = p.release_at;
        }
        let flipped: u32 = p
            .data()
            .iter()
            .zip(&orig)
            .map(|(a, b)| (a ^ b).count_ones())
            .sum();
        assert_eq!(flipped, u32::from(p.corrupted), "corruption flips one bit");
        assert_eq!(p.len(), len);
    }
}

// ------------------------------------------------------------------------------ engine PDUs

/// Session parameters chosen by one byte of input: around the burst limits.
fn engine_params(sel: u8) -> iscsi_proto::params::SessionParams {
    let bursts = [512u32, 4096, 8192, 65536];
    let max_burst = bursts[usize::from(sel >> 2 & 3)];
    iscsi_proto::params::SessionParams {
        initial_r2t: sel & 1 != 0,
        immediate_data: sel & 2 != 0,
        max_burst_length: max_burst,
        first_burst_length: bursts[usize::from(sel >> 4 & 3)].min(max_burst),
        max_outstanding_r2t: 1 + u32::from(sel >> 6 & 1),
        initiator_max_recv_data_segment_length: 8192,
        target_max_recv_data_segment_length: 8192,
        ..Default::default()
    }
}

struct FuzzLuns;

impl iscsi_proto::engine::target::LunDirectory for FuzzLuns {
    fn exists(&self, lun: u64) -> bool {
        lun == 0
    }
    fn size(
        &self,
        _itt: u32,
        _lun: u64,
        cdb: &[u8],
        _edtl: u32,
    ) -> iscsi_proto::engine::target::Sizing {
        // WRITE(10)-like: blocks in bytes 7..9, at most 128 KiB.
        let need = if cdb.first() == Some(&0x2a) {
            u64::from(u16::from_be_bytes([cdb[7], cdb[8]]).min(256)) * 512
        } else {
            0
        };
        iscsi_proto::engine::target::Sizing {
            need,
            early: None,
            transfer: None,
            decoded: None,
        }
    }
}

/// Up to 64 PDUs decoded from `bytes` (no digests, 64 KiB segments) for the engine
/// harnesses: a decode error is kept (the engine gets it as a wire error) and ends the stream
/// when it is out of step.
fn decode_pdus(bytes: &[u8]) -> Vec<Result<iscsi_wire::Pdu, iscsi_wire::WireError>> {
    let codec = iscsi_wire::Codec {
        header_digest: false,
        data_digest: false,
        max_recv_data_segment_length: 65536,
    };
    let mut buf = BytesMut::from(bytes);
    let mut pdus = Vec::new();
    while pdus.len() < 64 {
        match codec.decode(&mut buf) {
            Ok(Some(p)) => pdus.push(Ok(p)),
            Ok(None) => break,
            Err(e) => {
                let intact = e.stream_intact();
                pdus.push(Err(e));
                if !intact {
                    break;
                }
            }
        }
    }
    pdus
}

/// Feeds arbitrary PDUs to the engine's `handle_pdu` in either role (the first byte picks the
/// role and the parameters), with time advancing a second per PDU so pings and timeouts fire.
/// Target: every R2T carries a real TTT (never 0xffffffff) within the command's data; StatSN
/// runs in sequence; Data-In respects the initiator's MaxRecvDataSegmentLength and runs in
/// DataSN and offset order. Initiator: every submitted command completes at most once, and
/// exactly once when the connection has ended; Data-Out stays inside the write buffer and the
/// target's MaxRecvDataSegmentLength.
pub fn engine_pdu(data: &[u8]) {
    use std::time::{Duration, Instant};
    let mut input = Input(data);
    let sel = input.u8();
    let params = engine_params(input.u8());
    let pdus = decode_pdus(input.rest());
    let start = Instant::now();
    if sel & 0x80 == 0 {
        engine_target(params, start, pdus);
    } else {
        engine_initiator(params, start, pdus);
    }
    let _ = Duration::ZERO;
}

fn engine_target(
    params: iscsi_proto::params::SessionParams,
    start: std::time::Instant,
    pdus: Vec<Result<iscsi_wire::Pdu, iscsi_wire::WireError>>,
) {
    use iscsi_proto::engine::target::{Config, Connection, Event, Response};
    use iscsi_wire::{Header, RESERVED_TAG};
    use std::collections::HashMap;
    use std::time::Duration;
    let seg = params.initiator_max_recv_data_segment_length;
    let mut cfg = Config::new(params, 0, 100);
    cfg.cmd_window = 4;
    cfg.nop_interval = Some(Duration::from_secs(3));
    let mut c = Connection::new(cfg, start);
    let mut stat_sn = 100u32;
    let mut data_in: HashMap<u32, (u32, u32)> = HashMap::new();
    for (i, p) in pdus.into_iter().enumerate() {
        let now = start + Duration::from_secs(i as u64);
        match p {
            Ok(p) => c.handle_pdu(now, &FuzzLuns, p),
            Err(e) => c.handle_wire_error(now, &e),
        }
        c.handle_timeout(now);
        while let Some(e) = c.poll_event() {
            if let Event::Execute(x) = e {
                let len = if x.cdb.first() == Some(&0x28) {
                    x.edtl.min(65536) as usize
                } else {
                    0
                };
                c.complete(x.itt, Response::good(Bytes::from(vec![0u8; len])));
            }
        }
        while let Some(out) = c.poll_transmit() {
            let status = match &out.header {
                Header::R2t(r) => {
                    assert_ne!(r.ttt, RESERVED_TAG, "R2T with the reserved TTT");
                    assert!(r.desired_data_transfer_length > 0);
                    None
                }
                Header::DataIn(d) => {
                    assert!(
                        out.data.len() as u32 <= seg,
                        "Data-In over MaxRecvDataSegmentLength"
                    );
                    let (sn, off) = data_in.entry(d.itt).or_insert((0, 0));
                    assert_eq!(d.data_sn, *sn, "Data-In DataSN out of order");
                    assert_eq!(d.buffer_offset, *off, "Data-In offset out of order");
                    *sn += 1;
                    *off += out.data.len() as u32;
                    if d.status_present {
                        data_in.remove(&d.itt);
                        Some(d.stat_sn)
                    } else {
                        None
                    }
                }
                Header::ScsiResponse(r) => {
                    data_in.remove(&r.itt);
                    Some(r.stat_sn)
                }
                Header::NopIn(n) if n.itt != RESERVED_TAG => Some(n.stat_sn),
                Header::NopIn(_) => None,
                Header::TaskMgmtResponse(r) => Some(r.stat_sn),
                Header::TextResponse(r) => Some(r.stat_sn),
                Header::LogoutResponse(r) => Some(r.stat_sn),
                Header::Reject(r) => Some(r.stat_sn),
                Header::AsyncMessage(r) => Some(r.stat_sn),
                _ => None,
            };
            if let Some(s) = status {
                assert_eq!(s, stat_sn, "StatSN out of sequence");
                stat_sn = stat_sn.wrapping_add(1);
            }
        }
    }
}

fn engine_initiator(
    params: iscsi_proto::params::SessionParams,
    start: std::time::Instant,
    pdus: Vec<Result<iscsi_wire::Pdu, iscsi_wire::WireError>>,
) {
    use iscsi_proto::engine::initiator::{Command, Config, Connection, Data, Event};
    use iscsi_wire::Header;
    use std::collections::HashMap;
    use std::time::Duration;
    let seg = params.target_max_recv_data_segment_length;
    let mut c = Connection::new(Config::new(params, 1, 8, 100), start);
    let write_len = 20_000u32;
    let mut done: HashMap<u32, u32> = HashMap::new();
    let cmds = [
        Data::Read {
            buf: BytesMut::new(),
            len: 8192,
        },
        Data::Write(Bytes::from(vec![1u8; write_len as usize])),
        Data::None,
    ];
    for d in cmds {
        let itt = c
            .submit(
                start,
                Command {
                    lun: 0,
                    cdb: [0; 16],
                    data: d,
                    timed: false,
                },
            )
            .unwrap_or(0);
        done.insert(itt, 0);
    }
    for (i, p) in pdus.into_iter().enumerate() {
        let now = start + Duration::from_secs(i as u64);
        match p {
            Ok(p) => c.handle_pdu(now, p),
            Err(_) => c.handle_wire_error(now),
        }
        c.handle_timeout(now);
        while let Some(out) = c.poll_transmit() {
            if let Header::DataOut(d) = &out.header {
                assert!(
                    out.data.len() as u32 <= seg,
                    "Data-Out over MaxRecvDataSegmentLength"
                );
                assert!(d.buffer_offset + out.data.len() as u32 <= write_len);
            }
        }
        while let Some(e) = c.poll_event() {
            if let Event::Completed { itt, .. } = e {
                let n = done.get_mut(&itt).expect("completion for a submitted ITT");
                *n += 1;
                assert_eq!(*n, 1, "ITT {itt:#x} completed twice");
            }
        }
    }
    if c.closed().is_some() {
        assert!(done.values().all(|n| *n == 1), "a command never completed");
        assert_eq!(c.tasks_in_flight(), 0);
    }
}

/// The initiator's engine session ([`iscsi_proto::engine::session`]) under arbitrary target
/// PDUs, with connection losses and reattachments at points the input picks. Properties:
/// every submitted command completes exactly once (the session ends at the close), a
/// completion names a submitted ITT, COMPARE AND WRITE (not idempotent) is never sent on more
/// than one connection, and nothing is left in the task table.
pub fn engine_session(data: &[u8]) {
    use iscsi_proto::engine::initiator::{Command, Config as ConnConfig, Connection, Data};
    use iscsi_proto::engine::session::{Binding, Config, Event, Session};
    use iscsi_proto::engine::{CloseReason, ConnectionError, Side};
    use iscsi_wire::Header;
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    let mut input = Input(data);
    let sel = input.u8();
    let params = engine_params(input.u8());
    // PDUs per connection before the input cuts it (0: only when the engine ends it).
    let per_conn = usize::from(input.u8() % 8);
    let pdus = decode_pdus(input.rest());
    let start = Instant::now();
    let recovery = (sel & 1 == 1).then(|| Duration::from_secs(5 + u64::from(sel >> 4)));
    let conn = |now| Connection::new(ConnConfig::new(params.clone(), 1, 8, 100), now);
    let mut s = Session::new(
        Config {
            recovery_timeout: recovery,
            idempotent: ipsan_scsi::cdb::is_idempotent,
        },
        conn(start),
    );
    let write = Bytes::from(vec![1u8; 20_000]);
    let caw = Bytes::from(vec![2u8; 1024]);
    let cdb = |op: u8| {
        let mut c = [0u8; 16];
        c[0] = op;
        c
    };
    let cmds = [
        (
            cdb(0x88),
            Data::Read {
                buf: BytesMut::new(),
                len: 8192,
            },
            Binding::Free,
        ),
        (cdb(0x8a), Data::Write(write.clone()), Binding::Free),
        (cdb(0x8a), Data::Write(write.clone()), Binding::Bound),
        (cdb(0x89), Data::Write(caw), Binding::Free),
        (cdb(0x00), Data::None, Binding::Free),
    ];
    let mut done: HashMap<u32, u32> = HashMap::new();
    let mut caw_itt = None;
    for (cdb, data, binding) in cmds {
        let itt = s.alloc_itt();
        let cmd = Command {
            lun: 0,
            cdb,
            data,
            timed: false,
        };
        if s.submit_as(start, itt, cmd, binding).is_ok() {
            done.insert(itt, 0);
            if cdb[0] == 0x89 {
                caw_itt = Some(itt);
            }
        }
    }
    // Connections on which the COMPARE AND WRITE command PDU left.
    let mut caw_sent_on: Vec<u64> = Vec::new();
    let mut drain = |s: &mut Session, now: Instant, done: &mut HashMap<u32, u32>| loop {
        let mut any = false;
        while let Some(out) = s.poll_transmit() {
            any = true;
            if let Header::ScsiCommand(c) = &out.header {
                if Some(c.itt) == caw_itt && !caw_sent_on.contains(&s.generation()) {
                    caw_sent_on.push(s.generation());
                }
            }
        }
        while let Some(e) = s.poll_event() {
            any = true;
            match e {
                Event::Completed { itt, .. } => {
                    let n = done.get_mut(&itt).expect("completion for a submitted ITT");
                    *n += 1;
                    assert_eq!(*n, 1, "ITT {itt:#x} completed twice");
                }
                Event::Rebind { itt } => {
                    let _ = s.resubmit(now, itt, Data::Write(write.clone()));
                }
                _ => {}
            }
        }
        if !any {
            break;
        }
    };
    let mut on_conn = 0usize;
    for (i, p) in pdus.into_iter().enumerate() {
        let now = start + Duration::from_secs(i as u64);
        match p {
            Ok(p) => s.handle_pdu(now, p),
            Err(_) => s.handle_wire_error(now),
        }
        s.handle_timeout(now);
        drain(&mut s, now, &mut done);
        on_conn += 1;
        let cut = per_conn > 0 && on_conn >= per_conn;
        if cut && s.connection().closed().is_none() {
            s.peer_closed(now);
            drain(&mut s, now, &mut done);
        }
        if s.connection().closed().is_some() && s.ended().is_none() && recovery.is_some() {
            s.attach(now, conn(now));
            on_conn = 0;
            drain(&mut s, now, &mut done);
        }
    }
    let end = start + Duration::from_secs(100);
    s.end(
        end,
        ConnectionError {
            by: Side::Initiator,
            reason: CloseReason::Local,
        },
    );
    drain(&mut s, end, &mut done);
    assert!(
        caw_sent_on.len() <= 1,
        "COMPARE AND WRITE sent on {caw_sent_on:?}"
    );
    assert!(
        done.values().all(|n| *n == 1),
        "a command never completed: {done:?}"
    );
    assert_eq!(s.tasks_in_flight(), 0);
}

// ------------------------------------------------------------------------- NVMe/TCP PDUs

/// Frames NVMe/TCP PDUs out of arbitrary bytes with digests, PDA and PLEN limit chosen by the
/// first byte; see the module table for the properties.
pub fn nvme_pdu(data: &[u8]) {
    use nvme_wire::fabrics::{ConnectData, FabricsCommand, CONNECT_DATA_LEN, OPCODE_FABRICS};
    use nvme_wire::pdu::{Codec, Pdu, TermReq};
    let Some((&sel, stream)) = data.split_first() else {
        return;
    };
    let pda = [0u8, 1, 3, 31][usize::from(sel >> 2 & 3)];
    let codec = Codec {
        header_digest: sel & 1 != 0,
        data_digest: sel & 2 != 0,
        rx_pda: pda,
        tx_pda: pda,
        max_pdu_len: match sel >> 4 & 3 {
            0 => 128,
            1 => 8192,
            2 => 65_536 + 256,
            _ => 1 << 24,
        },
    };
    let mut buf = BytesMut::from(stream);
    // Each round consumes a whole PDU or stops, so this is bounded by the input length.
    loop {
        let before = buf.len();
        let framed = codec.frame(&buf);
        match codec.decode_from(&mut buf) {
            Ok(None) => {
                assert_eq!(buf.len(), before, "an incomplete PDU consumed bytes");
                let needed = codec.needed(&buf).expect("framed before");
                assert!(needed > 0, "a whole PDU was left undecoded");
                break;
            }
            Ok(Some(pdu)) => {
                let used = before - buf.len();
                assert_eq!(framed, Ok(Some(used)), "consumed other than PLEN");
                // Data PDUs within the configured limit, the others within their fixed ones.
                assert!(used as u64 <= u64::from(codec.max_pdu_len.max(152)));
                // What decodes re-encodes to the very same bytes.
                let original = &stream[stream.len() - before..][..used];
                let again = codec.to_bytes(&pdu).expect("a decoded PDU encodes");
                assert_eq!(&again[..], original, "re-encoding differs: {pdu:?}");
                if let Pdu::CapsuleCmd(c) = &pdu {
                    let _ = c.sqe.check_tcp(c.data.len());
                    if c.sqe.opcode == OPCODE_FABRICS {
                        if let Ok(f) = FabricsCommand::decode(&c.sqe) {
                            assert_eq!(f.to_sqe(), c.sqe, "Fabrics command round trip");
                        }
                        if c.data.len() == CONNECT_DATA_LEN {
                            if let Ok(d) = ConnectData::decode(&c.data) {
                                let b = d.encode().expect("decoded Connect data encodes");
                                assert_eq!(&b[..], &c.data[..], "Connect data round trip");
                            }
                        }
                    }
                }
            }
            Err(e) => {
                // A fatal error carries a termination request that itself round-trips.
                if let Some(fes) = e.fes() {
                    let header = &stream[stream.len() - before..];
                    let t = TermReq::for_error(&e, &header[..header.len().min(200)])
                        .expect("fatal errors have a termination request");
                    assert_eq!(t.fes, fes);
                    let w = codec
                        .to_bytes(&Pdu::C2hTermReq(t.clone()))
                        .expect("encodes");
                    assert_eq!(codec.decode(w).expect("decodes"), Pdu::C2hTermReq(t));
                    break;
                }
                assert!(
                    e.status().is_some(),
                    "non-fatal error without a status: {e}"
                );
                assert!(
                    buf.len() < before,
                    "a non-fatal error did not consume the PDU"
                );
            }
        }
    }
}

// ------------------------------------------------------------------------- NVMe controller

/// Drives `nvme_proto::controller::Target` with arbitrary Connects, admin and I/O commands,
/// block results in any order (or never), namespace changes, disconnects and time; see the
/// module table for the properties.
pub fn nvme_controller(data: &[u8]) {
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    use nvme_proto::controller::{
        AllowedHosts, BlockError, BlockOp, Channel, DiscoveryEntry, NamespaceConfig, Queue,
        Submitted, SubsystemConfig, Target, TargetConfig, TlsPeer, DISCOVERY_NQN,
    };
    use nvme_proto::{Command, Completion};
    use nvme_wire::entry::{Sgl, Sqe, SQE_LEN};
    use nvme_wire::fabrics::{
        Connect, ConnectData, FabricsCommand, FabricsKind, Property, PropertySet, CNTLID_DYNAMIC,
    };

    const SUBNQN: &str = "nqn.2026-01.io.ipsan:fuzz";
    const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz";
    let ns = |nsid: u32, blocks: u64, shift: u32| NamespaceConfig {
        nsid,
        size: blocks << shift,
        block_size: 1 << shift,
        nguid: [nsid as u8; 16],
        uuid: [nsid as u8 ^ 0x80; 16],
        eui64: [0; 8],
        deallocate_zeroes: nsid % 2 == 1,
        read_only: nsid == 3,
        reservations: nsid == 1,
    };
    let disc = vec![DiscoveryEntry {
        subnqn: SUBNQN.into(),
        traddr: "127.0.0.1".into(),
        trsvcid: "4420".into(),
        ipv6: false,
        portid: 1,
        treq_secure_channel: 0,
        sectype: 0,
    }];
    let cfg = TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: SUBNQN.into(),
            serial: "FUZZ".into(),
            model: "fuzz".into(),
            namespaces: vec![ns(1, 64, 9), ns(2, 16, 12)],
            hosts: AllowedHosts::Any,
            auth_required: false,
            volatile_write_cache: true,
        }],
        discovery: disc.clone(),
        max_io_queues: 4,
        queue_size: 32,
        in_capsule_data: 8192,
        max_transfer: 16384,
        ..TargetConfig::default()
    };
    let mut t = Target::new(cfg).expect("valid configuration");
    let mut sizes: HashMap<u32, u64> = HashMap::from([(1, 64 << 9), (2, 16 << 12)]);
    let mut now = Instant::now();
    let mut queues: Vec<Queue> = Vec::new();
    // Outstanding block requests: (queue index, tag, group id); groups: id → (cid, left).
    let mut pending: Vec<(usize, u64, u64, BlockOp)> = Vec::new();
    let mut groups: HashMap<u64, (u16, usize)> = HashMap::new();
    let mut next_group = 0u64;

    let connect = |qid: u16, sqsize: u16, kato: u32, subnqn: &str, hostnqn: &str, cntlid: u16| {
        let d = ConnectData {
            hostid: [7; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode()
        .expect("valid NQNs");
        let sqe = FabricsCommand {
            cid: 1,
            flags: nvme_wire::entry::PSDT_SGL,
            sgl: Sgl::InCapsule {
                offset: 0,
                length: d.len() as u32,
            },
            kind: FabricsKind::Connect(Connect {
                recfmt: 0,
                qid,
                sqsize,
                cattr: 0,
                kato,
            }),
        }
        .to_sqe();
        Command {
            sqe,
            data: Bytes::copy_from_slice(&d),
        }
    };
    let check = |cmd: &Command, c: &Completion| {
        assert_eq!(c.cqe.cid, cmd.sqe.cid, "completion for another command");
        assert!(
            c.data.len() <= cmd.sqe.sgl.length() as usize,
            "more data than the SGL describes"
        );
    };

    let mut input = Input(data);
    let flags = input.u8();
    if flags & 1 != 0 {
        // A host's bring-up, so the fuzzer starts where the I/O paths are.
        let subnqn = if flags & 2 != 0 {
            DISCOVERY_NQN
        } else {
            SUBNQN
        };
        if let Ok((mut admin, _)) = t.connect(
            &connect(0, 31, 10_000, subnqn, HOSTNQN, CNTLID_DYNAMIC),
            now,
        ) {
            let sqe = FabricsCommand {
                cid: 2,
                flags: nvme_wire::entry::PSDT_SGL,
                sgl: Sgl::Transport { length: 0 },
                kind: FabricsKind::PropertySet(PropertySet {
                    size8: false,
                    property: Property::Cc,
                    value: 6 << 16 | 4 << 20 | 1,
                }),
            }
            .to_sqe();
            let _ = t.submit(
                &mut admin,
                Command {
                    sqe,
                    data: Bytes::new(),
                },
                now,
            );
            let cntlid = admin.cntlid();
            queues.push(admin);
            if let Ok((q, _)) = t.connect(&connect(1, 31, 0, subnqn, HOSTNQN, cntlid), now) {
                queues.push(q);
            }
        }
    }

    let mut steps = 0;
    while !input.0.is_empty() && steps < 256 {
        steps += 1;
        let action = input.u8();
        match action % 8 {
            0 | 1 => {
                let raw = input.bytes(SQE_LEN);
                let mut b = [0u8; SQE_LEN];
                b[..raw.len()].copy_from_slice(raw);
                let mut sqe = Sqe::from_bytes(&b);
                let len = usize::from(input.u8()) * 16;
                let data = Bytes::copy_from_slice(input.bytes(len));
                if action & 0x80 != 0 {
                    // Make the command well-formed for the transport, so it reaches the
                    // controller's own checks.
                    sqe.flags = nvme_wire::entry::PSDT_SGL;
                    sqe.sgl = if data.is_empty() {
                        Sgl::Transport {
                            length: u32::from(input.u16()),
                        }
                    } else {
                        Sgl::InCapsule {
                            offset: 0,
                            length: data.len() as u32,
                        }
                    };
                }
                if queues.is_empty() {
                    continue;
                }
                let qi = usize::from(input.u8()) % queues.len();
                let cmd = Command { sqe, data };
                let q = &mut queues[qi];
                let admin = q.qid() == 0;
                let r = if admin || action & 0x40 != 0 {
                    t.submit(q, cmd.clone(), now)
                } else {
                    q.submit(cmd.clone(), now)
                };
                match r {
                    Submitted::Done(c) => check(&cmd, &c),
                    Submitted::Held => assert!(admin, "an I/O command held"),
                    Submitted::Block(reqs) => {
                        assert!(!admin, "block requests from the admin queue");
                        assert!(!reqs.is_empty());
                        let g = next_group;
                        next_group += 1;
                        groups.insert(g, (cmd.sqe.cid, reqs.len()));
                        for r in reqs {
                            let size = *sizes.get(&r.nsid).expect("a namespace that exists");
                            let (off, len) = match &r.op {
                                BlockOp::Read { offset, len }
                                | BlockOp::Discard { offset, len }
                                | BlockOp::WriteZeroes { offset, len } => (*offset, *len),
                                BlockOp::Write { offset, data, .. } => (*offset, data.len() as u64),
                                BlockOp::Flush | BlockOp::Reservation(_) => (0, 0),
                            };
                            assert!(
                                off.checked_add(len).is_some_and(|e| e <= size),
                                "{r:?} beyond {size}"
                            );
                            assert!(
                                !pending.iter().any(|p| p.0 == qi && p.1 == r.tag),
                                "tag reused while outstanding"
                            );
                            pending.push((qi, r.tag, g, r.op));
                        }
                    }
                }
            }
            2 => {
                let qid = input.u16() % 6;
                let sqsize = input.u16() % 40;
                let kato = u32::from(input.u16());
                let subnqn = [SUBNQN, DISCOVERY_NQN, "nqn.unknown"][usize::from(input.u8() % 3)];
                let hostnqn = [HOSTNQN, "nqn.other"][usize::from(input.u8() % 2)];
                let cntlid = match input.u8() % 3 {
                    0 => CNTLID_DYNAMIC,
                    1 => queues.first().map_or(1, Queue::cntlid),
                    _ => input.u16(),
                };
                let cmd = connect(qid, sqsize, kato, subnqn, hostnqn, cntlid);
                // Plain TCP, or TLS keyed for some host and subsystem (TP 8011).
                let tls = match input.u8() % 3 {
                    0 => None,
                    1 => Some((hostnqn, subnqn)),
                    _ => Some((
                        [HOSTNQN, "nqn.other"][usize::from(input.u8() % 2)],
                        [SUBNQN, DISCOVERY_NQN][usize::from(input.u8() % 2)],
                    )),
                };
                let channel = Channel {
                    tls: tls.map(|(h, s)| TlsPeer {
                        hostnqn: h.into(),
                        subnqn: s.into(),
                    }),
                };
                match t.connect_on(&cmd, now, &channel) {
                    Ok((q, c)) => {
                        check(&cmd, &c);
                        assert!(c.cqe.status.is_success());
                        if let Some((h, s)) = tls {
                            assert!(
                                h == hostnqn && s == subnqn,
                                "a TLS connection keyed for {h}/{s} connected as {hostnqn}/{subnqn}"
                            );
                        }
                        queues.push(q);
                    }
                    Err(c) => {
                        check(&cmd, &c);
                        assert!(!c.cqe.status.is_success());
                    }
                }
            }
            3 => {
                // Any first command, whole.
                let raw = input.bytes(SQE_LEN);
                let mut b = [0u8; SQE_LEN];
                b[..raw.len()].copy_from_slice(raw);
                let len = usize::from(input.u16() % 1100);
                let cmd = Command {
                    sqe: Sqe::from_bytes(&b),
                    data: Bytes::copy_from_slice(input.bytes(len)),
                };
                match t.connect(&cmd, now) {
                    Ok((q, c)) => {
                        check(&cmd, &c);
                        queues.push(q);
                    }
                    Err(c) => check(&cmd, &c),
                }
            }
            4 => {
                now += Duration::from_millis(u64::from(input.u16()) * 4);
                t.handle_timeout(now);
                if let Some(next) = t.poll_timeout() {
                    assert!(next > now, "a deadline left in the past");
                }
            }
            5 if !pending.is_empty() => {
                let i = usize::from(input.u8()) % pending.len();
                let (qi, tag, g, op) = pending.swap_remove(i);
                let how = input.u8();
                let result = match how % 4 {
                    0 => Err([
                        BlockError::Media,
                        BlockError::NoSpace,
                        BlockError::OutOfRange,
                        BlockError::ReadOnly,
                        BlockError::Internal,
                    ][usize::from(how / 4) % 5]),
                    1 => {
                        let n = usize::from(input.u8());
                        Ok(Bytes::copy_from_slice(input.bytes(n)))
                    }
                    _ => Ok(match &op {
                        BlockOp::Read { len, .. } => Bytes::from(vec![0u8; *len as usize]),
                        _ => Bytes::new(),
                    }),
                };
                let c = queues[qi].block_done(tag, result);
                let entry = groups.get_mut(&g).expect("group");
                entry.1 -= 1;
                if entry.1 == 0 {
                    let (cid, _) = groups.remove(&g).expect("group");
                    let c = c.expect("the last result completes the command");
                    assert_eq!(c.cqe.cid, cid);
                } else {
                    assert!(c.is_none(), "completed before its last block result");
                }
            }
            6 => {
                let mut list = Vec::new();
                for _ in 0..input.u8() % 4 {
                    let nsid = u32::from(input.u8() % 5);
                    let n = ns(
                        nsid,
                        u64::from(input.u8() % 64),
                        [9, 12][usize::from(input.u8() % 2)],
                    );
                    list.push(n);
                }
                if t.set_namespaces(SUBNQN, list.clone()).is_ok() {
                    // Requests already handed out refer to the old table; keep their sizes.
                    for n in &list {
                        let s = sizes.entry(n.nsid).or_insert(0);
                        *s = (*s).max(n.size);
                    }
                }
                if input.u8() % 2 == 0 {
                    t.set_discovery_entries(Vec::new());
                } else {
                    t.set_discovery_entries(disc.clone());
                }
            }
            7 if !queues.is_empty() => {
                let i = usize::from(input.u8()) % queues.len();
                // Its outstanding requests are abandoned with it, as a driver drops them.
                pending.retain(|p| p.0 != i);
                for p in &mut pending {
                    if p.0 > i {
                        p.0 -= 1;
                    }
                }
                let q = queues.remove(i);
                t.disconnect(&q);
            }
            _ => {}
        }
        while let Some(e) = t.poll_event() {
            if let nvme_proto::controller::Event::AdminCompletion { completion, .. } = e {
                assert!(completion.cqe.status.is_success());
            }
        }
    }
}
