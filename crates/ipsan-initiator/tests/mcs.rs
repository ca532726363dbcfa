//! Several connections per session (issue 28) through the tokio driver
//! (`ipsan_initiator::McsSession`) against the real ipsan target in-process on 127.0.0.1:0:
//! `ipsan bench`'s verify workloads (writes of seeded patterns, every block read back and
//! compared) over four connections of one session, plain and sealed (each connection with its
//! own Seal login), with both spreading policies; a target that grants one connection
//! (MaxConnections=1) gets one; a connection cut under load ends the session at
//! ErrorRecoveryLevel 0 (every command fails, none hangs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{bounded, config, seal_target};
use ipsan_bench::{self as bench, Limit, RwMode, Workload};
use ipsan_initiator::seal::SealRequest;
use ipsan_initiator::{
    Error, IscsiUrl, LoginOptions, McsConfig, McsSession, SessionConfig, Spread,
};
use ipsan_seal::{Cipher, Psk, SealPolicy};
use ipsan_target::config::{self as tconfig, Config, TargetConfig};
use ipsan_target::ServerHandle;

const IQN: &str = "iqn.2026-11.org.ipsan:mcs-driver";
const SECRET: &[u8] = b"mcs-driver-pre-shared-secret-0123456789";

async fn plain_target(connections_per_session: u32) -> ServerHandle {
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![TargetConfig::new(
            IQN,
            tconfig::luns_from_specs(&["mem:32MiB".to_owned()]).unwrap(),
        )],
        connections_per_session,
        ..Config::default()
    };
    c.validate().unwrap();
    ServerHandle::start(&c).await.unwrap()
}

fn url(h: &ServerHandle) -> IscsiUrl {
    IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap()
}

fn sealed() -> SessionConfig {
    let req = SealRequest {
        ciphers: vec![Cipher::Aes256Gcm],
        chunk: ipsan_seal::DEFAULT_CHUNK,
        psk: Psk::new(SECRET.to_vec()).unwrap(),
        pool: None,
    };
    SessionConfig {
        extension: Some(req.factory()),
        ..config(LoginOptions::default())
    }
}

/// The target's sessions and each one's open connections, once it shows `want` connections
/// in its first session (it adds a connection right after the last login response).
async fn target_view(h: &ServerHandle, want: usize) -> Vec<usize> {
    let mut v = Vec::new();
    for _ in 0..200 {
        v = h
            .registry()
            .sessions()
            .iter()
            .map(|s| s.connections)
            .collect();
        if v.first() == Some(&want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    v
}

/// Writes, reads and a mix, each verified block by block, at depth 16.
async fn verify_workloads(s: &Arc<McsSession>) {
    for (seed, mode) in [(1, RwMode::Write), (1, RwMode::Read), (2, RwMode::RandRw)] {
        let w = Workload {
            mode,
            mix_read_percent: 50,
            block_size: 64 * 1024,
            depth: 16,
            offset: 0,
            limit: Limit::Bytes(16 << 20),
            verify: true,
            seed,
            data: None,
            rate: None,
        };
        let (m, _) = bench::run_on(s.clone(), w, None, None)
            .await
            .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert!(m.verify.checked_blocks > 0, "{mode:?} verified nothing");
    }
}

#[test]
fn accepts_verify_workloads_over_four_connections_with_either_spread() {
    bounded(60, async {
        let h = plain_target(4).await;
        for spread in [Spread::LeastBytes, Spread::RoundRobin] {
            let s = McsSession::open(
                &url(&h),
                &config(LoginOptions::default()),
                McsConfig {
                    connections: 4,
                    spread,
                },
            )
            .await
            .unwrap();
            assert_eq!(s.connections(), 4);
            assert_eq!(
                target_view(&h, 4).await,
                vec![4],
                "one session of four connections at the target"
            );
            let s = Arc::new(s);
            verify_workloads(&s).await;
            let placed = s.commands_per_connection();
            assert_eq!(placed.len(), 4, "{spread:?}: {placed:?}");
            assert!(
                placed.iter().all(|(_, n)| *n >= 16),
                "{spread:?}: every connection carried commands: {placed:?}"
            );
            Arc::try_unwrap(s).unwrap().logout().await.unwrap();
            assert_eq!(target_view(&h, 0).await, Vec::<usize>::new(), "logged out");
        }
        h.shutdown().await.unwrap();
    });
}

#[test]
fn accepts_sealed_verify_workloads_over_four_connections_each_with_its_own_seal_login() {
    bounded(90, async {
        let h = seal_target(IQN, SECRET, SealPolicy::Required, None).await;
        let s = McsSession::open(
            &url(&h),
            &sealed(),
            McsConfig {
                connections: 4,
                spread: Spread::LeastBytes,
            },
        )
        .await
        .unwrap();
        assert_eq!(s.connections(), 4);
        assert_eq!(target_view(&h, 4).await, vec![4]);
        let s = Arc::new(s);
        verify_workloads(&s).await;
        let placed = s.commands_per_connection();
        assert!(
            placed.len() == 4 && placed.iter().all(|(_, n)| *n >= 16),
            "{placed:?}"
        );
        Arc::try_unwrap(s).unwrap().logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

#[test]
fn accepts_a_target_granting_one_connection_and_uses_that_one() {
    bounded(60, async {
        let h = plain_target(1).await;
        let s = McsSession::open(
            &url(&h),
            &config(LoginOptions::default()),
            McsConfig {
                connections: 4,
                spread: Spread::RoundRobin,
            },
        )
        .await
        .unwrap();
        assert_eq!(s.connections(), 1);
        let s = Arc::new(s);
        verify_workloads(&s).await;
        assert_eq!(target_view(&h, 1).await, vec![1], "no joining login tried");
        assert_eq!(s.commands_per_connection().len(), 1);
        Arc::try_unwrap(s).unwrap().logout().await.unwrap();
        h.shutdown().await.unwrap();
    });
}

/// A loopback relay in front of the target that can cut any one of the connections through
/// it (the attacker or the broken path of issue 28: one TCP connection of a session dies).
struct Relay {
    addr: std::net::SocketAddr,
    pairs: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::AbortHandle,
}

impl Relay {
    async fn start(to: std::net::SocketAddr) -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let pairs: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let p = pairs.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut a, _)) = l.accept().await {
                let mut b = tokio::net::TcpStream::connect(to).await.unwrap();
                let t = tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
                });
                p.lock().unwrap().push(t.abort_handle());
            }
        })
        .abort_handle();
        Self {
            addr,
            pairs,
            accept,
        }
    }

    /// Drops both sockets of the `i`-th connection.
    fn cut(&self, i: usize) {
        self.pairs.lock().unwrap()[i].abort();
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        for t in self.pairs.lock().unwrap().iter() {
            t.abort();
        }
    }
}

#[test]
fn rejects_commands_once_one_of_four_connections_is_cut_at_erl_0_without_hanging() {
    bounded(60, async {
        let h = plain_target(4).await;
        let relay = Relay::start(h.addrs[0]).await;
        let u = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", relay.addr)).unwrap();
        let s = McsSession::open(
            &u,
            &config(LoginOptions::default()),
            McsConfig {
                connections: 4,
                spread: Spread::RoundRobin,
            },
        )
        .await
        .unwrap();
        assert_eq!(s.connections(), 4);
        let s = Arc::new(s);
        // Commands in flight on every connection when the third one is cut.
        let mut tasks = Vec::new();
        for k in 0..64u64 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                s.write(k * 128, bytes::Bytes::from(vec![k as u8; 64 * 1024]))
                    .await
            }));
        }
        relay.cut(2);
        let mut lost = 0;
        for t in tasks {
            match tokio::time::timeout(Duration::from_secs(15), t)
                .await
                .expect("every command ends, none hangs")
                .unwrap()
            {
                Ok(()) => {}
                Err(Error::ConnectionLost(_)) => lost += 1,
                Err(e) => panic!("{e:?}"),
            }
        }
        assert!(lost > 0, "the cut connection's commands failed");
        let r = tokio::time::timeout(Duration::from_secs(10), s.read(0, 8))
            .await
            .expect("fails at once, does not hang");
        assert!(matches!(r, Err(Error::ConnectionLost(_))), "{r:?}");
        assert_eq!(s.connections(), 0, "ERL 0: the session ended with it");
        drop(relay);
        h.shutdown().await.unwrap();
    });
}
