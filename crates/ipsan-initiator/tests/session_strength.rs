//! Sessions keep their strength (issue 31, item 4): ipsan's initiator against the in-process
//! target, through a loopback relay that records the wire, as an attacker on the path would
//! see it. A login replaces a session (RFC 7143 §6.3.5) only when it proves as much as that
//! session did; per-initiator Seal secrets bind their names; weaker logins cannot fill a
//! stronger initiator's session quota; an honest reinstatement still works.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{bounded, config};
use ipsan_initiator::seal::SealRequest;
use ipsan_initiator::{
    ChapCredentials, ChapSecret, Error, IscsiUrl, LoginOptions, Session, SessionConfig,
};
use ipsan_seal::{Cipher, Psk, SealPolicy};
use ipsan_target::config::{self as tconfig, Config, SealSettings, TargetConfig};
use ipsan_target::ServerHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const IQN: &str = "iqn.2026-11.org.ipsan:strength";
const VICTIM: &str = "iqn.2026-11.org.example:victim";
const TARGET_WIDE: &[u8] = b"strength-target-wide-secret-0123456789";
const OWN: &[u8] = b"strength-victims-own-secret-9876543210";

/// A target with Seal `policy`, the target-wide secret, and `own` as VICTIM's own secret.
async fn target(policy: SealPolicy, own: bool, max_sessions: Option<usize>) -> ServerHandle {
    let mut t = TargetConfig::new(
        IQN,
        tconfig::luns_from_specs(&["mem:16MiB".to_owned()]).unwrap(),
    );
    t.seal = SealSettings {
        policy,
        secret: Some(Psk::new(TARGET_WIDE.to_vec()).unwrap()),
        initiators: if own {
            vec![(VICTIM.to_owned(), Psk::new(OWN.to_vec()).unwrap())]
        } else {
            Vec::new()
        },
    };
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        crypto_workers: 2,
        targets: vec![t],
        ..Config::default()
    };
    if let Some(m) = max_sessions {
        c.limits.max_sessions_per_initiator = m;
    }
    c.validate().unwrap();
    ServerHandle::start(&c).await.unwrap()
}

/// A loopback relay recording what the initiator sends. `cut` ends the initiator's side of
/// every connection so far while the target's side stays open and silent: a path lost
/// without a FIN reaching the target, after which an initiator reinstates its session.
struct Relay {
    addr: SocketAddr,
    sent: Arc<Mutex<Vec<u8>>>,
    cut: Arc<Mutex<CancellationToken>>,
    /// Target-side socket halves of cut connections, held open until the test ends.
    held: Arc<Mutex<Vec<Box<dyn std::any::Any + Send>>>>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let cut = Arc::new(Mutex::new(CancellationToken::new()));
        let held: Arc<Mutex<Vec<Box<dyn std::any::Any + Send>>>> = Arc::default();
        let (sent2, cut2, held2) = (sent.clone(), cut.clone(), held.clone());
        tokio::spawn(async move {
            while let Ok((a, _)) = l.accept().await {
                let b = TcpStream::connect(to).await.unwrap();
                let (mut ar, mut aw) = a.into_split();
                let (mut br, bw) = b.into_split();
                let stop = cut2.lock().unwrap().clone();
                let (sent, held, stop2) = (sent2.clone(), held2.clone(), stop.clone());
                let held_r = held2.clone();
                tokio::spawn(async move {
                    let mut bw = bw;
                    let mut buf = vec![0u8; 65536];
                    loop {
                        tokio::select! {
                            () = stop.cancelled() => break,
                            r = ar.read(&mut buf) => match r {
                                Ok(n) if n > 0 => {
                                    sent.lock().unwrap().extend_from_slice(&buf[..n]);
                                    if bw.write_all(&buf[..n]).await.is_err() {
                                        return;
                                    }
                                }
                                _ => return,
                            },
                        }
                    }
                    held.lock().unwrap().push(Box::new(bw));
                });
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    loop {
                        tokio::select! {
                            () = stop2.cancelled() => break,
                            r = br.read(&mut buf) => match r {
                                Ok(n) if n > 0 => {
                                    if aw.write_all(&buf[..n]).await.is_err() {
                                        return;
                                    }
                                }
                                _ => return,
                            },
                        }
                    }
                    held_r.lock().unwrap().push(Box::new(br));
                });
            }
        });
        Self {
            addr,
            sent,
            cut,
            held,
        }
    }

    fn cut(&self) {
        let mut c = self.cut.lock().unwrap();
        c.cancel();
        *c = CancellationToken::new();
    }

    /// The InitiatorName and ISID of the first Login Request that crossed the relay, read as
    /// an eavesdropper reads them (the BHS's ISID, RFC 7143 §11.12.5; the text segment).
    fn first_login(&self) -> (String, [u8; 6]) {
        let w = self.sent.lock().unwrap();
        assert!(w.len() >= 48 && w[0] & 0x3f == 0x03, "a Login Request");
        let isid: [u8; 6] = w[8..14].try_into().unwrap();
        let len = usize::from(w[5]) << 16 | usize::from(w[6]) << 8 | usize::from(w[7]);
        let text = &w[48 + usize::from(w[4]) * 4..][..len];
        let name = text
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(b"InitiatorName="))
            .map(|n| String::from_utf8(n.to_vec()).unwrap())
            .expect("InitiatorName in the first Login Request");
        (name, isid)
    }
}

fn url(addr: SocketAddr) -> IscsiUrl {
    IscsiUrl::parse(&format!("iscsi://{addr}/{IQN}/0")).unwrap()
}

fn login(name: &str, isid: Option<[u8; 6]>) -> LoginOptions {
    LoginOptions {
        initiator_name: name.to_owned(),
        isid,
        ..LoginOptions::default()
    }
}

fn sealed(login: LoginOptions, secret: &[u8]) -> SessionConfig {
    let req = SealRequest {
        ciphers: vec![Cipher::Aes256Gcm],
        chunk: ipsan_seal::DEFAULT_CHUNK,
        psk: Psk::new(secret.to_vec()).unwrap(),
        pool: None,
    };
    SessionConfig {
        extension: Some(req.factory()),
        ..config(login)
    }
}

/// One 512-byte block.
fn block(fill: u8) -> Bytes {
    Bytes::from(vec![fill; 512])
}

/// Whether `got` is the block `block(fill)`.
fn is_block(got: &[u8], fill: u8) -> bool {
    got.len() == 512 && got.iter().all(|b| *b == fill)
}

/// The status of a refused login (class, detail).
fn refused(r: Result<Session, Error>) -> (u8, u8) {
    match r {
        Err(Error::LoginRefused { class, detail, .. }) => (class, detail),
        Err(e) => panic!("expected a login refusal, got {e}"),
        Ok(_) => panic!("the login succeeded"),
    }
}

/// Issue 31 item 4 as an attacker does it: a sealed session does I/O; from what the wire
/// shows (InitiatorName, ISID) the attacker logs in without Seal and without credentials
/// under `--seal allowed`. Before: 0x0000, and the sealed session's next write failed with
/// "connection lost". Now: 0x0201, counted as an authentication failure, and the sealed
/// session goes on.
#[test]
fn rejects_plaintext_reinstatement_of_a_sealed_session() {
    bounded(60, async {
        let h = target(SealPolicy::Allowed, false, None).await;
        let relay = Relay::start(h.addrs[0]).await;
        let victim = Session::open(&url(relay.addr), &sealed(login(VICTIM, None), TARGET_WIDE))
            .await
            .unwrap();
        victim.write(8, block(0xA1)).await.unwrap();

        let (name, isid) = relay.first_login();
        assert_eq!(name, VICTIM);
        let before = h.limit_stats().auth_failures;
        let attack = Session::open(&url(h.addrs[0]), &config(login(&name, Some(isid)))).await;
        assert_eq!(refused(attack), (0x02, 0x01), "authentication failure");
        assert_eq!(
            h.limit_stats().auth_failures,
            before + 1,
            "the refusal counts toward the lockout"
        );

        victim.write(16, block(0xB2)).await.unwrap();
        assert!(is_block(&victim.read(8, 1).await.unwrap(), 0xA1));
        assert!(is_block(&victim.read(16, 1).await.unwrap(), 0xB2));
        assert_eq!(h.registry().session_count(), 1, "only the sealed session");
        victim.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

/// The target-wide secret is a group secret, but not for names that have their own: a
/// sealed login with it as VICTIM is refused, also when the name is spelled in capitals
/// (iSCSI names are case-folded, RFC 3722; before, the capitalized name fell back to the
/// target-wide secret and logged in sealed). Another name may use it; VICTIM with its own
/// secret logs in.
#[test]
fn rejects_target_wide_secret_claiming_a_name_with_its_own_secret() {
    bounded(60, async {
        let h = target(SealPolicy::Required, true, None).await;
        let u = url(h.addrs[0]);
        for name in [VICTIM.to_owned(), VICTIM.to_ascii_uppercase()] {
            let r = Session::open(&u, &sealed(login(&name, None), TARGET_WIDE)).await;
            assert!(
                r.is_err(),
                "{name} logged in with the target-wide secret although it has its own"
            );
        }
        let other = Session::open(
            &u,
            &sealed(login("iqn.2026-11.org.example:other", None), TARGET_WIDE),
        )
        .await
        .unwrap();
        other.write(0, block(1)).await.unwrap();
        let own = Session::open(&u, &sealed(login(VICTIM, None), OWN))
            .await
            .unwrap();
        own.write(1, block(2)).await.unwrap();
        other.logout().await.unwrap();
        own.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

/// A sealed login with the target-wide secret does not replace a session sealed with the
/// name's own secret (it could only arise across a reload that dropped the own secret, but
/// the rule is the same: never a weaker secret).
#[test]
fn rejects_target_wide_sealed_reinstatement_of_an_own_secret_session() {
    bounded(60, async {
        let toml = |own: bool| {
            let mut s = format!(
                "[server]\nportals = [\"127.0.0.1:0\"]\n[[target]]\niqn = \"{IQN}\"\n\
                 [target.seal]\npolicy = \"required\"\nsecret = \"{}\"\n",
                std::str::from_utf8(TARGET_WIDE).unwrap()
            );
            if own {
                s += &format!(
                    "[[target.seal.initiator]]\nname = \"{VICTIM}\"\nsecret = \"{}\"\n",
                    std::str::from_utf8(OWN).unwrap()
                );
            }
            s + "[[target.lun]]\nid = 0\nbackend = \"mem:8MiB\"\n"
        };
        let h = ServerHandle::start(&Config::from_toml(&toml(true)).unwrap())
            .await
            .unwrap();
        let u = url(h.addrs[0]);
        let isid = [0x80, 0, 0, 0x31, 0, 4];
        let s = Session::open(&u, &sealed(login(VICTIM, Some(isid)), OWN))
            .await
            .unwrap();
        s.write(3, block(3)).await.unwrap();
        let next = ipsan_target::config::FileConfig::parse(&toml(false)).unwrap();
        h.registry().apply(next, false).unwrap();
        let r = Session::open(&u, &sealed(login(VICTIM, Some(isid)), TARGET_WIDE)).await;
        assert_eq!(refused(r), (0x02, 0x01));
        s.write(4, block(4)).await.unwrap();
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

/// A CHAP session is not replaced by a login without authentication: the operator turned
/// CHAP off (sessions logged in stay, docs/target.md), and someone logs in under the CHAP
/// session's name and ISID. Before: 0x0000 and the CHAP session was gone.
#[test]
fn rejects_no_auth_login_replacing_a_chap_session() {
    bounded(60, async {
        let toml = |chap: bool| {
            format!(
                "[server]\nportals = [\"127.0.0.1:0\"]\n[[target]]\niqn = \"{IQN}\"\n{}\
                 [[target.lun]]\nid = 0\nbackend = \"mem:8MiB\"\n",
                if chap {
                    "[target.chap]\nuser = \"alice\"\nsecret = \"alice-chap-secret-16\"\n"
                } else {
                    ""
                }
            )
        };
        let h = ServerHandle::start(&Config::from_toml(&toml(true)).unwrap())
            .await
            .unwrap();
        let relay = Relay::start(h.addrs[0]).await;
        let mut opts = login(VICTIM, None);
        opts.chap = Some(ChapCredentials {
            name: "alice".into(),
            secret: ChapSecret::new(b"alice-chap-secret-16".to_vec()).unwrap(),
        });
        let victim = Session::open(&url(relay.addr), &config(opts.clone()))
            .await
            .unwrap();
        victim.write(5, block(5)).await.unwrap();
        let (name, isid) = relay.first_login();

        // The operator turns CHAP off; the CHAP session stays.
        h.registry()
            .apply(
                ipsan_target::config::FileConfig::parse(&toml(false)).unwrap(),
                false,
            )
            .unwrap();
        let attack = Session::open(&url(h.addrs[0]), &config(login(&name, Some(isid)))).await;
        assert_eq!(refused(attack), (0x02, 0x01));
        victim.write(6, block(6)).await.unwrap();
        assert!(is_block(&victim.read(5, 1).await.unwrap(), 5));

        // The same CHAP user may still reinstate it (CHAP back on, same name and ISID).
        h.registry()
            .apply(
                ipsan_target::config::FileConfig::parse(&toml(true)).unwrap(),
                false,
            )
            .unwrap();
        opts.isid = Some(isid);
        let again = Session::open(&url(h.addrs[0]), &config(opts))
            .await
            .unwrap();
        assert!(is_block(&again.read(6, 1).await.unwrap(), 6));
        again.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

/// Plaintext logins under a sealed initiator's name cannot use up its session quota: with
/// `max_sessions_per_initiator = 2`, two plaintext sessions under VICTIM's name (anyone may
/// open them under `allowed`) leave room for two sealed ones; a third plaintext one is
/// refused (0x0302), as is a third sealed one. Before: the sealed login got 0x0302.
#[test]
fn accepts_sealed_logins_when_plaintext_sessions_fill_the_quota() {
    bounded(60, async {
        let h = target(SealPolicy::Allowed, true, Some(2)).await;
        let u = url(h.addrs[0]);
        let mut plain = Vec::new();
        for _ in 0..2 {
            plain.push(
                Session::open(&u, &config(login(VICTIM, None)))
                    .await
                    .unwrap(),
            );
        }
        let mut sealed_sessions = Vec::new();
        for i in 0..2u8 {
            let s = Session::open(&u, &sealed(login(VICTIM, None), OWN))
                .await
                .unwrap_or_else(|e| panic!("sealed login {i} refused: {e}"));
            s.write(u64::from(i), block(i)).await.unwrap();
            sealed_sessions.push(s);
        }
        assert_eq!(
            refused(Session::open(&u, &config(login(VICTIM, None))).await),
            (0x03, 0x02),
            "a third plaintext session"
        );
        assert_eq!(
            refused(Session::open(&u, &sealed(login(VICTIM, None), OWN)).await),
            (0x03, 0x02),
            "a third sealed session"
        );
        for s in plain.into_iter().chain(sealed_sessions) {
            s.logout().await.unwrap();
        }
        h.shutdown().await.unwrap();
    });
}

/// An honest reinstatement still works: a sealed session whose path is lost (the target
/// never sees the connection end) recovers by logging in again with the same name, ISID and
/// secret (session recovery, as the Linux initiator and libiscsi do); the target replaces
/// the old session with it and the next write succeeds.
#[test]
fn accepts_reinstatement_with_the_same_credentials_after_a_lost_connection() {
    bounded(60, async {
        let h = target(SealPolicy::Allowed, true, None).await;
        let relay = Relay::start(h.addrs[0]).await;
        let mut cfg = sealed(login(VICTIM, None), OWN);
        cfg.recovery_timeout = Some(Duration::from_secs(20));
        cfg.nop_interval = Some(Duration::from_millis(300));
        cfg.nop_timeout = Duration::from_secs(1);
        let s = Session::open(&url(relay.addr), &cfg).await.unwrap();
        s.write(7, block(7)).await.unwrap();
        let old_tsih = h.registry().sessions()[0].info.tsih;

        relay.cut();
        s.write(8, block(8)).await.unwrap();
        assert!(is_block(&s.read(7, 1).await.unwrap(), 7));
        let now = h.registry().sessions();
        assert_eq!(now.len(), 1, "the new session replaced the old one");
        assert_ne!(now[0].info.tsih, old_tsih, "a new session (reinstated)");
        assert!(
            !relay.held.lock().unwrap().is_empty(),
            "the old path was held open"
        );
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}
