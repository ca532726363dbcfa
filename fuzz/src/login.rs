//! Login: text keys and their negotiation (RFC 7143 §6.1, §6.2, §13, [`text_negotiate`]), the
//! target's login machine ([`login_sm`]) and the initiator's ([`initiator_login`]).

use bytes::{Bytes, BytesMut};

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
