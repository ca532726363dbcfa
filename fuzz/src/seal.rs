//! Seal: its login keys with CPace ([`seal_login`]), opening sealed data ([`seal_open`]) and
//! record protection ([`seal_record`]).

use bytes::{Bytes, BytesMut};

use super::Input;

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
