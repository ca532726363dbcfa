//! Session recovery (issue 15) over loopback: ipsan's in-process target behind a TCP relay
//! this test controls. The relay cuts every connection (both sides see the end), stalls them
//! (a WAN black hole: only the keepalive notices) or refuses new ones, while reads and writes
//! are in flight; the session reconnects, reinstates itself (RFC 7143 §6.3.5) and sends the
//! idempotent commands again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{bounded, config, seal_target};
use ipsan_initiator::seal::SealRequest;
use ipsan_initiator::{DataDir, Error, IscsiUrl, LoginOptions, Session, SessionConfig};
use ipsan_seal::{Cipher, CryptoPool, Psk, SealPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

const IQN: &str = "iqn.2026-11.org.ipsan:recovery";
const SECRET: &[u8] = b"recovery-test-pre-shared-secret-0123456789";

#[derive(Default)]
struct RelayState {
    /// Refuse new connections (accept and close at once).
    down: bool,
    conns: Vec<AbortHandle>,
    accepted: usize,
}

/// A loopback TCP relay to the target that the test can cut, stall and take down.
struct Relay {
    addr: std::net::SocketAddr,
    state: Arc<Mutex<RelayState>>,
    /// While true, nothing is forwarded (bytes wait in the relay): a black hole.
    stall: watch::Sender<bool>,
    /// Where new connections go.
    to: Arc<Mutex<std::net::SocketAddr>>,
}

impl Relay {
    async fn start(to: std::net::SocketAddr) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let state = Arc::new(Mutex::new(RelayState::default()));
        let stall = watch::channel(false).0;
        let to = Arc::new(Mutex::new(to));
        let (st, stall_tx, dest) = (state.clone(), stall.clone(), to.clone());
        tokio::spawn(async move {
            while let Ok((a, _)) = l.accept().await {
                if st.lock().unwrap().down {
                    drop(a);
                    continue;
                }
                let to = *dest.lock().unwrap();
                let Ok(b) = TcpStream::connect(to).await else {
                    continue;
                };
                a.set_nodelay(true).unwrap();
                b.set_nodelay(true).unwrap();
                let (ar, aw) = a.into_split();
                let (br, bw) = b.into_split();
                let h1 = tokio::spawn(pipe(ar, bw, stall_tx.subscribe()));
                let h2 = tokio::spawn(pipe(br, aw, stall_tx.subscribe()));
                let mut s = st.lock().unwrap();
                s.accepted += 1;
                s.conns.push(h1.abort_handle());
                s.conns.push(h2.abort_handle());
            }
        });
        Self {
            addr,
            state,
            stall,
            to,
        }
    }

    /// Ends every relayed connection now (both sockets closed).
    fn cut(&self) {
        for h in self.state.lock().unwrap().conns.drain(..) {
            h.abort();
        }
    }

    fn set_down(&self, down: bool) {
        self.state.lock().unwrap().down = down;
    }

    fn set_stall(&self, stall: bool) {
        self.stall.send_replace(stall);
    }

    fn redirect(&self, to: std::net::SocketAddr) {
        *self.to.lock().unwrap() = to;
    }

    fn accepted(&self) -> usize {
        self.state.lock().unwrap().accepted
    }

    fn url(&self) -> IscsiUrl {
        IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", self.addr)).unwrap()
    }
}

async fn pipe(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    mut stall: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let Ok(n) = r.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        if stall.wait_for(|s| !*s).await.is_err() {
            return;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

fn recovering(sealed: bool, timeout: Duration) -> SessionConfig {
    let extension = sealed.then(|| {
        SealRequest {
            ciphers: vec![Cipher::Aes256Gcm],
            chunk: ipsan_seal::DEFAULT_CHUNK,
            psk: Psk::new(SECRET.to_vec()).unwrap(),
            pool: Some(Arc::new(CryptoPool::new(2).unwrap())),
        }
        .factory()
    });
    SessionConfig {
        extension,
        nop_interval: Some(Duration::from_millis(500)),
        nop_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(2),
        login_timeout: Duration::from_secs(5),
        recovery_timeout: Some(timeout),
        ..config(LoginOptions::default())
    }
}

/// 64 KiB (128 blocks) that name their worker, slot and round.
fn pattern(worker: u64, slot: u64, round: u64) -> Bytes {
    let mut v = vec![0u8; 64 * 1024];
    for (i, c) in v.chunks_mut(8).enumerate() {
        let x = (worker << 48) ^ (slot << 32) ^ (round << 16) ^ i as u64;
        c.copy_from_slice(&x.to_le_bytes());
    }
    Bytes::from(v)
}

const WORKERS: u64 = 12;
const SLOTS: u64 = 8;
const BLOCKS: u32 = 128;

fn lba(worker: u64, slot: u64) -> u64 {
    (worker * SLOTS + slot) * u64::from(BLOCKS)
}

/// Workers write and read back their own slots while the relay cuts, stalls and refuses;
/// every command completes with the right data and the final image is what was written last.
async fn rides_out_cuts(sealed: bool) {
    let h = seal_target(IQN, SECRET, SealPolicy::Allowed, None).await;
    let relay = Arc::new(Relay::start(h.addrs[0]).await);
    let s = Arc::new(
        Session::open(&relay.url(), &recovering(sealed, Duration::from_secs(20)))
            .await
            .unwrap(),
    );
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (s, done) = (s.clone(), done.clone());
        workers.push(tokio::spawn(async move {
            let mut last = vec![None; SLOTS as usize];
            let mut round = 0u64;
            while !done.load(std::sync::atomic::Ordering::Acquire) || round < 2 * SLOTS {
                let slot = round % SLOTS;
                let data = pattern(w, slot, round);
                s.write(lba(w, slot), data.clone())
                    .await
                    .unwrap_or_else(|e| panic!("worker {w} write round {round}: {e}"));
                let got = s
                    .read(lba(w, slot), BLOCKS)
                    .await
                    .unwrap_or_else(|e| panic!("worker {w} read round {round}: {e}"));
                assert!(got[..] == data[..], "worker {w} slot {slot} round {round}");
                last[slot as usize] = Some(round);
                round += 1;
            }
            (w, last)
        }));
    }
    // Cuts with both sides told; a refused reconnect for a while; a black hole only the
    // keepalive finds.
    let recovered = |n: u64| {
        let s = s.clone();
        async move {
            while s.recovery_stats().recoveries < n {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Let commands flow on the new connection before the next fault.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.cut();
    recovered(1).await;
    relay.set_down(true);
    relay.cut();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    relay.set_down(false);
    recovered(2).await;
    relay.set_stall(true);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    relay.cut();
    relay.set_stall(false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    done.store(true, std::sync::atomic::Ordering::Release);
    let mut finals = Vec::new();
    for t in workers {
        finals.push(t.await.unwrap());
    }
    // The image holds the last write of every slot (no old copy landed after a newer one).
    for (w, last) in finals {
        for (slot, round) in last.iter().enumerate() {
            let round = round.expect("every slot written");
            let got = s.read(lba(w, slot as u64), BLOCKS).await.unwrap();
            assert!(
                got[..] == pattern(w, slot as u64, round)[..],
                "final image: worker {w} slot {slot}"
            );
        }
    }
    let st = s.recovery_stats();
    eprintln!(
        "recovery stats: {st:?}; relay accepted {}",
        relay.accepted()
    );
    assert!(st.connection_losses >= 3, "{st:?}");
    assert!(st.recoveries >= 3, "{st:?}");
    assert!(st.commands_reissued > 0, "{st:?}");
    assert!(
        st.reconnects > st.recoveries,
        "the refused period costs attempts: {st:?}"
    );
    assert_eq!(st.commands_failed_not_idempotent, 0);
    assert!(st.last_recovery_ms.is_some());
    let _ = h.shutdown().await;
}

#[test]
fn recovers_reads_and_writes_in_flight_across_cuts() {
    bounded(60, rides_out_cuts(false));
}

#[test]
fn recovers_sealed_reads_and_writes_in_flight_across_cuts_with_fresh_keys() {
    bounded(60, rides_out_cuts(true));
}

/// COMPARE AND WRITE of one block: 2 blocks of data (verify, then write), SBC-4 §5.3.
fn compare_and_write(lba: u64) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = 1;
    c
}

#[test]
fn fails_compare_and_write_in_flight_with_retryable_sense_and_reissues_the_read_beside_it() {
    bounded(60, async {
        let h = seal_target(IQN, SECRET, SealPolicy::Allowed, None).await;
        let relay = Relay::start(h.addrs[0]).await;
        let s = Arc::new(
            Session::open(&relay.url(), &recovering(true, Duration::from_secs(20)))
                .await
                .unwrap(),
        );
        s.write(0, Bytes::from(vec![7u8; 512])).await.unwrap();
        // Both commands are sent into a black hole, then the connection is cut.
        relay.set_stall(true);
        let caw = {
            let s = s.clone();
            tokio::spawn(async move {
                let mut d = vec![7u8; 512];
                d.extend_from_slice(&[9u8; 512]);
                s.command(compare_and_write(0), DataDir::Write(Bytes::from(d)))
                    .await
            })
        };
        let read = {
            let s = s.clone();
            tokio::spawn(async move { s.read(0, 1).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        relay.cut();
        relay.set_stall(false);
        let e = caw
            .await
            .unwrap()
            .expect_err("COMPARE AND WRITE must not be resent");
        assert!(matches!(e, Error::NotReissued { opcode: 0x89, .. }), "{e}");
        let sense = e.sense().expect("a SCSI answer");
        assert_eq!(e.scsi_status(), Some(0x02));
        assert_eq!(
            (sense.key, sense.asc, sense.ascq),
            (ipsan_initiator::scsi::SenseKey::ABORTED_COMMAND, 0x4B, 0x07)
        );
        // The read beside it was reissued, and the COMPARE AND WRITE never ran.
        assert_eq!(&read.await.unwrap().unwrap()[..], &[7u8; 512][..]);
        let st = s.recovery_stats();
        assert_eq!(st.commands_failed_not_idempotent, 1, "{st:?}");
        assert!(st.commands_reissued >= 1, "{st:?}");
        // A COMPARE AND WRITE sent after the recovery runs normally.
        let mut d = vec![7u8; 512];
        d.extend_from_slice(&[9u8; 512]);
        s.command(compare_and_write(0), DataDir::Write(Bytes::from(d)))
            .await
            .unwrap();
        assert_eq!(&s.read(0, 1).await.unwrap()[..], &[9u8; 512][..]);
        let _ = h.shutdown().await;
    });
}

#[test]
fn fails_waiting_commands_with_recovery_timed_out_when_the_target_stays_away() {
    bounded(60, async {
        let h = seal_target(IQN, SECRET, SealPolicy::Allowed, None).await;
        let relay = Relay::start(h.addrs[0]).await;
        let limit = Duration::from_secs(2);
        let s = Arc::new(
            Session::open(&relay.url(), &recovering(false, limit))
                .await
                .unwrap(),
        );
        s.write(0, Bytes::from(vec![3u8; 4096])).await.unwrap();
        relay.set_down(true);
        relay.cut();
        let t0 = Instant::now();
        let mut waiting = Vec::new();
        for i in 0..8u64 {
            let s = s.clone();
            waiting.push(tokio::spawn(async move { s.read(i * 8, 8).await }));
        }
        for w in waiting {
            let e = w.await.unwrap().expect_err("the target is unreachable");
            assert!(
                matches!(e, Error::RecoveryTimedOut { after, .. } if after == limit),
                "{e}"
            );
        }
        let took = t0.elapsed();
        assert!(took >= limit - Duration::from_millis(100), "{took:?}");
        assert!(took < limit + Duration::from_secs(2), "bounded: {took:?}");
        // Past the timeout, a new command fails at once instead of waiting.
        let t1 = Instant::now();
        assert!(matches!(
            s.read(0, 8).await,
            Err(Error::RecoveryTimedOut { .. })
        ));
        assert!(t1.elapsed() < Duration::from_millis(500));
        assert!(s.recovery_stats().commands_failed_timeout >= 9);
        // Reconnects go on in the background: once the target is back, so is the session.
        relay.set_down(false);
        let t2 = Instant::now();
        let back = loop {
            match s.read(0, 8).await {
                Ok(d) => break d,
                Err(Error::RecoveryTimedOut { .. }) if t2.elapsed() < Duration::from_secs(15) => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(&back[..], &[3u8; 4096][..]);
        let _ = h.shutdown().await;
    });
}

#[test]
fn without_recovery_a_cut_fails_commands_with_connection_lost() {
    bounded(30, async {
        let h = seal_target(IQN, SECRET, SealPolicy::Allowed, None).await;
        let relay = Relay::start(h.addrs[0]).await;
        let s = Session::open(&relay.url(), &recovering(false, Duration::ZERO))
            .await
            .unwrap();
        s.write(0, Bytes::from(vec![1u8; 512])).await.unwrap();
        relay.cut();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let e = s.read(0, 1).await.expect_err("no recovery");
        assert!(matches!(e, Error::ConnectionLost(_)), "{e}");
        assert!(s.failure().is_some());
        assert_eq!(relay.accepted(), 1, "no reconnect");
        assert_eq!(
            s.recovery_stats(),
            ipsan_initiator::RecoveryStats::default()
        );
        let _ = h.shutdown().await;
    });
}

/// Tells the test when a command's data starts being sealed (its connection taken).
#[derive(Debug, Default)]
struct SealStarted(tokio::sync::Notify);

impl ipsan_initiator::CommandObserver for SealStarted {
    fn on_event(&self, _itt: u32, event: ipsan_initiator::CommandEvent, _offset: u64, _len: u64) {
        if event == ipsan_initiator::CommandEvent::SealStart {
            self.0.notify_one();
        }
    }
}

/// The flake of `stops_recovery_at_once_when_the_reinstating_login_is_refused_for_good`
/// (`ConnectionLost(PeerClosed)` once in a loaded run), made likely: a command takes the
/// connection before its loss is seen and reaches the session engine only after the
/// reinstating login was refused (there, a caller descheduled in between; here, a 32 MiB
/// write sealed meanwhile). It fails with the refusal, as every command does once recovery
/// stopped, not with the old connection's end.
#[test]
fn a_command_that_took_the_lost_connection_fails_with_the_refusal_of_its_recovery() {
    bounded(30, async {
        let h = seal_target(IQN, SECRET, SealPolicy::Allowed, None).await;
        let other = seal_target(
            "iqn.2026-11.org.ipsan:other",
            SECRET,
            SealPolicy::Allowed,
            None,
        )
        .await;
        let relay = Relay::start(h.addrs[0]).await;
        let s = Arc::new(
            Session::open(&relay.url(), &recovering(true, Duration::from_secs(60)))
                .await
                .unwrap(),
        );
        let started = Arc::new(SealStarted::default());
        assert!(s.set_observer(started.clone()));
        let w = {
            let s = s.clone();
            tokio::spawn(async move { s.write(0, Bytes::from(vec![5u8; 32 << 20])).await })
        };
        started.0.notified().await;
        relay.redirect(other.addrs[0]);
        relay.cut();
        let e = w.await.unwrap().expect_err("the login is refused");
        assert!(matches!(e, Error::LoginRefused { class: 2, .. }), "{e}");
        let st = s.recovery_stats();
        assert_eq!((st.reconnects, st.recoveries), (1, 0), "{st:?}");
        let _ = other.shutdown().await;
        let _ = h.shutdown().await;
    });
}

#[test]
fn stops_recovery_at_once_when_the_reinstating_login_is_refused_for_good() {
    bounded(30, async {
        let h = seal_target(IQN, SECRET, SealPolicy::Allowed, None).await;
        // A portal that does not have our target: the login is refused with status class 2
        // (target not found, RFC 7143 §11.13.5).
        let other = seal_target(
            "iqn.2026-11.org.ipsan:other",
            SECRET,
            SealPolicy::Allowed,
            None,
        )
        .await;
        let relay = Relay::start(h.addrs[0]).await;
        let s = Session::open(&relay.url(), &recovering(false, Duration::from_secs(60)))
            .await
            .unwrap();
        relay.redirect(other.addrs[0]);
        relay.cut();
        let t = Instant::now();
        let e = s.read(0, 1).await.expect_err("the login is refused");
        assert!(matches!(e, Error::LoginRefused { class: 2, .. }), "{e}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "not retried for the recovery timeout: {:?}",
            t.elapsed()
        );
        let st = s.recovery_stats();
        assert_eq!((st.reconnects, st.recoveries), (1, 0), "{st:?}");
        // Later commands fail the same way at once.
        assert!(matches!(
            s.read(0, 1).await,
            Err(Error::LoginRefused { class: 2, .. })
        ));
        let _ = other.shutdown().await;
        let _ = h.shutdown().await;
    });
}
