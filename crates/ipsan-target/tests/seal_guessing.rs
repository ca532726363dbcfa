//! Issue 31 item 2: no offline test of a Seal password. The real target in-process, a raw
//! client that logs in with the seal crate's initiator half and records every Login PDU, and
//! an attacker that runs a word list against what it recorded (a passive eavesdropper) or
//! against the target's answer to its own offer (an active prober).
//!
//! On 98d9f39 (schedule v3, keys = HKDF(PSK, Ni||Nt)) the attacker's first candidate is
//! exactly v3's derivation and singles out the secret from a recorded login (what
//! `rejects_offline_guessing_over_a_recorded_login` shows on a v3 answer computed for the same
//! login), a probe that disconnects after the answer is never counted, and a Seal
//! confirmation failure (0x0202) is never counted either: both tests below fail there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use curve25519_dalek::ristretto::{CompressedRistretto, RistrettoPoint};
use hmac::{Hmac, Mac};
use ipsan_seal::negotiate::{KEY_CHUNK, KEY_CONFIRM, KEY_NONCE, KEY_SEAL, KEY_SHARE};
use ipsan_seal::{
    Cipher, Direction, LoginTranscript, NegotiationError, Psk, SealOffer, SealPolicy, SessionIds,
    TranscriptHash,
};
use ipsan_target::config::{self, Config, SealSettings, TargetConfig};
use ipsan_target::ServerHandle;
use iscsi_wire::header::*;
use iscsi_wire::{Codec, Header, Pdu};
use sha2::{Digest, Sha256, Sha512};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IQN: &str = "iqn.2026-11.org.ipsan:guessing";
const INI: &str = "iqn.2026-11.org.example:victim";
/// A human-chosen secret of the allowed length, of the kind issue 31 names.
const SECRET: &str = "Summer2024!Summer2024!";
const ISID: [u8; 6] = [0x80, 9, 8, 7, 6, 5];

async fn start(auth: Option<ipsan_target::limits::AuthBackoff>) -> ServerHandle {
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        crypto_workers: 1,
        targets: vec![TargetConfig {
            iqn: IQN.into(),
            alias: None,
            allow: Vec::new(),
            chap: None,
            chap_hosts: Vec::new(),
            seal: SealSettings {
                policy: SealPolicy::Required,
                secret: Some(Psk::new(SECRET.as_bytes().to_vec()).unwrap()),
                initiators: Vec::new(),
            },
            luns: config::luns_from_specs(&["mem:1MiB".into()]).unwrap(),
        }],
        ..Config::default()
    };
    if let Some(a) = auth {
        c.limits.auth = a;
    }
    c.validate().unwrap();
    ServerHandle::start(&c).await.unwrap()
}

fn ids() -> SessionIds {
    SessionIds {
        initiator_name: INI.into(),
        target_name: IQN.into(),
        isid: ISID,
    }
}

fn login_req(transit: bool, cmd_sn: u32, itt: u32) -> LoginRequest {
    LoginRequest {
        transit,
        continue_: false,
        csg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
        nsg: if transit {
            Stage::FULL_FEATURE_PHASE
        } else {
            Stage(0)
        },
        version_max: 0,
        version_min: 0,
        isid: ISID,
        tsih: 0,
        itt,
        cid: 0,
        cmd_sn,
        exp_stat_sn: 0,
    }
}

fn text(keys: &[(String, String)]) -> String {
    keys.iter().map(|(k, v)| format!("{k}={v}\0")).collect()
}

/// A raw iSCSI client that records every Login PDU as it crosses the wire.
struct Client {
    s: TcpStream,
    buf: BytesMut,
    codec: Codec,
    transcript: LoginTranscript,
}

impl Client {
    async fn connect(h: &ServerHandle) -> Self {
        Self {
            s: TcpStream::connect(h.addrs[0]).await.unwrap(),
            buf: BytesMut::new(),
            codec: Codec::default(),
            transcript: LoginTranscript::new(),
        }
    }

    async fn send(&mut self, pdu: Pdu) {
        self.transcript.add_sent(Direction::InitiatorToTarget, &pdu);
        let mut out = BytesMut::new();
        self.codec.encode(&pdu, &mut out).unwrap();
        self.s.write_all(&out).await.unwrap();
    }

    /// The next Login Response: (status class, detail, its keys); `None` if the target closed.
    async fn recv(&mut self) -> Option<(u8, u8, Vec<(String, String)>)> {
        let fut = async {
            loop {
                if let Some(p) = self.codec.decode(&mut self.buf).unwrap() {
                    self.transcript
                        .add_received(Direction::TargetToInitiator, &p);
                    let Header::LoginResponse(r) = &p.header else {
                        panic!("{:?}", p.header)
                    };
                    let keys = iscsi_wire::text::parse(&p.data).unwrap();
                    return Some((r.status_class, r.status_detail, keys));
                }
                if self.s.read_buf(&mut self.buf).await.unwrap_or(0) == 0 {
                    return None;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), fut)
            .await
            .expect("answer in time")
    }

    /// Sends the first operational Login Request (T=0) with a Seal offer made with `guess`.
    async fn offer(&mut self, guess: &str) -> SealOffer {
        let offer = SealOffer::new(
            vec![Cipher::Aes256Gcm],
            65536,
            Psk::new(guess.as_bytes().to_vec()).unwrap(),
            ids(),
        )
        .unwrap();
        let body = format!(
            "InitiatorName={INI}\0TargetName={IQN}\0SessionType=Normal\0{}",
            text(&offer.keys())
        );
        self.send(Pdu::new(login_req(false, 1, 1), Bytes::from(body)))
            .await;
        offer
    }
}

fn get<'a>(keys: &'a [(String, String)], key: &str) -> &'a str {
    keys.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key}"))
}

fn hexc(v: &str) -> Vec<u8> {
    hex::decode(v.strip_prefix("0x").unwrap()).unwrap()
}

/// What a passive attacker has of one login: the Seal keys both ways as they crossed the
/// wire, the identities (in clear in the Login PDUs) and `H_t`, which it computes from the
/// recorded Login PDUs exactly as the peers do.
#[derive(Clone)]
struct Recording {
    offer: Vec<(String, String)>,
    answer: Vec<(String, String)>,
    h_t: TranscriptHash,
}

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(key).unwrap();
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn lp(out: &mut Vec<u8>, x: &[u8]) {
    out.extend_from_slice(&u16::try_from(x.len()).unwrap().to_be_bytes());
    out.extend_from_slice(x);
}

/// The attacker's copy of the key schedule's last step, common to v3 and v4 (docs/seal.md §3):
/// HKDF-SHA256(salt = Ni||Nt, IKM = `ikm`) expanded to K_confirm under the schedule `label`,
/// then `confirm_t = HMAC(K_confirm, "target" || H_t)`.
fn confirm_t_for(label: &[u8], ikm: &[u8], rec: &Recording) -> [u8; 32] {
    let mut salt = hexc(get(&rec.offer, KEY_NONCE));
    salt.extend_from_slice(&hexc(get(&rec.answer, KEY_NONCE)));
    let mut info = Vec::new();
    lp(&mut info, b"confirm");
    lp(&mut info, label);
    lp(&mut info, get(&rec.answer, KEY_SEAL).as_bytes());
    info.extend_from_slice(
        &get(&rec.answer, KEY_CHUNK)
            .parse::<u32>()
            .unwrap()
            .to_be_bytes(),
    );
    lp(&mut info, INI.as_bytes());
    lp(&mut info, IQN.as_bytes());
    info.extend_from_slice(&ISID);
    lp(&mut info, get(&rec.offer, KEY_SEAL).as_bytes());
    let prk = hmac(&salt, &[ikm]);
    let k_confirm = hmac(&prk, &[&info, &[1]]);
    hmac(&k_confirm, &[b"target", &rec.h_t])
}

/// CPace's generator for a candidate password (draft-irtf-cfrg-cpace, ristretto255/SHA-512),
/// as the attacker would compute it: public inputs plus the guess.
fn generator(guess: &[u8], ni: &[u8]) -> RistrettoPoint {
    let lv = ipsan_seal::cpace::lv_cat;
    let ci = lv(&[b"ipsan-seal v4", INI.as_bytes(), IQN.as_bytes(), &ISID]);
    let dsi: &[u8] = b"CPaceRistretto255";
    let zpad = vec![0u8; 128 - 1 - (guess.len() + 1) - (dsi.len() + 1)];
    let h = Sha512::digest(lv(&[dsi, guess, &zpad, &ci, ni]));
    RistrettoPoint::from_uniform_bytes(&h.into())
}

fn isk(ni: &[u8], k: &[u8], ya: &[u8], yb: &[u8]) -> Vec<u8> {
    let lv = ipsan_seal::cpace::lv_cat;
    let mut h = Sha512::new();
    h.update(lv(&[b"CPaceRistretto255_ISK", ni, k]));
    h.update(lv(&[ya, b""]));
    h.update(lv(&[yb, b""]));
    h.finalize().to_vec()
}

/// The attacker's procedure: every confirmation value it can compute for `guess` from what
/// it recorded. v3: the PSK keyed HKDF directly. v4 as if the PSK still keyed HKDF, and v4's
/// CPace ISK with every shared point that public values and the guess give (the shares, the
/// guess's generator, their sum): without a CPace scalar the real K = ya·yb·g is out of reach.
fn candidates(guess: &str, rec: &Recording) -> Vec<[u8; 32]> {
    let mut out = vec![
        confirm_t_for(b"ipsan-seal v3", guess.as_bytes(), rec),
        confirm_t_for(b"ipsan-seal v4", guess.as_bytes(), rec),
    ];
    if let (Some(ya), Some(yb)) = (
        rec.offer.iter().find(|(k, _)| k == KEY_SHARE),
        rec.answer.iter().find(|(k, _)| k == KEY_SHARE),
    ) {
        let (ya, yb) = (hexc(&ya.1), hexc(&yb.1));
        let ni = hexc(get(&rec.offer, KEY_NONCE));
        let g = generator(guess.as_bytes(), &ni);
        let pa = CompressedRistretto::from_slice(&ya)
            .unwrap()
            .decompress()
            .unwrap();
        let pb = CompressedRistretto::from_slice(&yb)
            .unwrap()
            .decompress()
            .unwrap();
        for k in [pa, pb, g, pa + pb, pa + g, pb + g] {
            let i = isk(&ni, k.compress().as_bytes(), &ya, &yb);
            out.push(confirm_t_for(b"ipsan-seal v4", &i, rec));
        }
    }
    out
}

/// Words whose candidates reproduce the recorded `confirm_t`.
fn singled_out(rec: &Recording, words: &[String]) -> Vec<String> {
    let seen = hexc(get(&rec.answer, KEY_CONFIRM));
    words
        .iter()
        .filter(|w| candidates(w, rec).iter().any(|c| c[..] == seen[..]))
        .cloned()
        .collect()
}

/// A word list of the shape people choose (season + year + symbol, doubled to reach 16
/// bytes): 624 words of at least 16 bytes, the real secret among them.
fn word_list() -> Vec<String> {
    let mut w = Vec::new();
    for base in [
        "Summer", "Winter", "Spring", "Autumn", "Welcome", "Company", "Storage", "Password",
        "Iscsi", "Admin",
    ] {
        for year in 2019..2027 {
            for sym in ["!", "#", "", "123"] {
                let one = format!("{base}{year}{sym}");
                w.push(format!("{one}{one}"));
                w.push(format!("{one}-{base}"));
            }
        }
    }
    // The target takes no secret shorter than Psk::MIN_LEN.
    w.retain(|x| x.len() >= Psk::MIN_LEN);
    assert!(w.iter().any(|x| x == SECRET));
    w
}

async fn wait_for_failures(h: &ServerHandle, n: u64) -> u64 {
    for _ in 0..100 {
        if h.limit_stats().auth_failures >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.limit_stats().auth_failures
}

/// A recorded sealed login of the real target gives a passive attacker nothing to test a
/// word list against: no word, the right one included, reproduces the target's `confirm_t`.
/// The same procedure on the v3 answer for the very same login (the confirmation v3's target
/// sent, recomputed with v3's derivation) singles out exactly the secret: that is what
/// 98d9f39 put on the wire, and there this test fails at its first assertion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_offline_guessing_over_a_recorded_login() {
    let h = start(None).await;
    let mut c = Client::connect(&h).await;
    let offer = c.offer(SECRET).await;
    let sent = offer.keys();
    let (class, _, answer) = c.recv().await.unwrap();
    assert_eq!(class, 0);
    let h_t = c.transcript.hash_before_last();
    let (_, confirm) = offer
        .handle_answer_bound(&answer, &h_t, &c.transcript.hash())
        .expect("the real initiator verifies the target");
    c.send(Pdu::new(login_req(true, 1, 2), Bytes::from(text(&confirm))))
        .await;
    let (class, detail, _) = c.recv().await.unwrap();
    assert_eq!((class, detail), (0, 0), "the recorded login succeeded");

    let rec = Recording {
        offer: sent,
        answer,
        h_t,
    };
    let words = word_list();
    assert_eq!(
        singled_out(&rec, &words),
        Vec::<String>::new(),
        "a recorded login singled out a guess"
    );

    // The procedure is not blind: on v3's answer to this same login it finds the secret.
    let mut v3 = rec.clone();
    let v3_confirm = confirm_t_for(b"ipsan-seal v3", SECRET.as_bytes(), &rec);
    for (k, v) in &mut v3.answer {
        if k == KEY_CONFIRM {
            *v = format!("0x{}", hex::encode(v3_confirm));
        }
    }
    assert_eq!(singled_out(&v3, &words), vec![SECRET.to_owned()]);
    h.shutdown().await.unwrap();
}

/// An active prober offers with one guess and takes the target's answer. The answer tests
/// that one guess (its own initiator half verifies it or not) and nothing else: neither fresh
/// offers for the other words nor the passive procedure single out the secret, even though
/// the list holds it. Every probe is counted toward the lockout, whether the prober
/// disconnects after the answer or sends a bad confirmation (0x0202), and once the name is
/// locked out the target refuses the next offer (0x0301) without answering it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_probe_tests_one_guess_and_is_counted_by_the_lockout() {
    let h = start(Some(ipsan_target::limits::AuthBackoff {
        name_free_failures: 2,
        lockout_base: Duration::from_secs(60),
        delay_base: Duration::from_millis(1),
        delay_max: Duration::from_millis(1),
        ..Default::default()
    }))
    .await;
    let words = word_list();
    let wrong = "Winter2023!Winter2023!";

    // Probe 1: a wrong guess, answer taken, connection dropped.
    let mut c = Client::connect(&h).await;
    let offer = c.offer(wrong).await;
    let sent = offer.keys();
    let (class, _, answer) = c.recv().await.unwrap();
    assert_eq!(class, 0, "the target answers an offer");
    let h_t = c.transcript.hash_before_last();
    assert_eq!(
        offer
            .handle_answer_bound(&answer, &h_t, &c.transcript.hash())
            .unwrap_err(),
        NegotiationError::ConfirmationFailed,
        "the probe learns its one guess was wrong"
    );
    // Testing the rest of the list against this answer: a fresh offer per word (same nonce,
    // the word as secret) verifies for none of them, the right one included.
    let ni: [u8; 32] = hexc(get(&sent, KEY_NONCE)).try_into().unwrap();
    let confirmed: Vec<&String> = words
        .iter()
        .filter(|w| {
            let o = SealOffer::with_nonce(
                vec![Cipher::Aes256Gcm],
                65536,
                Psk::new(w.as_bytes().to_vec()).unwrap(),
                ids(),
                ni,
            )
            .unwrap();
            o.handle_answer_bound(&answer, &h_t, &c.transcript.hash())
                .is_ok()
        })
        .collect();
    assert!(confirmed.is_empty(), "{confirmed:?}");
    let rec = Recording {
        offer: sent,
        answer,
        h_t,
    };
    assert_eq!(singled_out(&rec, &words), Vec::<String>::new());
    drop(c);
    assert_eq!(
        wait_for_failures(&h, 1).await,
        1,
        "an abandoned probe counts as an authentication failure"
    );

    // Probe 2: the right guess does verify (that is the one guess a probe buys), and the
    // abandoned login is counted all the same.
    let mut c = Client::connect(&h).await;
    let offer = c.offer(SECRET).await;
    let (_, _, answer) = c.recv().await.unwrap();
    offer
        .handle_answer_bound(
            &answer,
            &c.transcript.hash_before_last(),
            &c.transcript.hash(),
        )
        .expect("the one guess tested is the one offered");
    drop(c);
    assert_eq!(wait_for_failures(&h, 2).await, 2);

    // Probe 3: a wrong guess that sends a (wrong) confirmation is refused 0x0202 and counted.
    let mut c = Client::connect(&h).await;
    let _offer = c.offer(wrong).await;
    let _ = c.recv().await.unwrap();
    let bad = vec![(KEY_CONFIRM.to_owned(), format!("0x{}", "00".repeat(32)))];
    c.send(Pdu::new(login_req(true, 1, 2), Bytes::from(text(&bad))))
        .await;
    let (class, detail, _) = c.recv().await.unwrap();
    assert_eq!((class, detail), (2, 2));
    assert_eq!(wait_for_failures(&h, 3).await, 3);

    // Locked out: the next offer is refused before the target answers it.
    let mut c = Client::connect(&h).await;
    let _offer = c.offer(SECRET).await;
    let (class, detail, keys) = c.recv().await.unwrap();
    assert_eq!((class, detail), (3, 1), "locked out after three guesses");
    assert!(keys.iter().all(|(k, _)| k != KEY_SHARE && k != KEY_CONFIRM));
    assert_eq!(h.limit_stats().lockout_rejects, 1);
    assert_eq!(
        h.limit_stats().auth_failures,
        3,
        "a refused login is no guess"
    );
    h.shutdown().await.unwrap();
}
