//! The initiator's protocol engine for several connections per session
//! (`iscsi_proto::engine::mcs`, issue 28) against the real target over loopback TCP: four
//! connections, each logged in by the real originator login machine (the leading login
//! offering MaxConnections=4, then three joining with the session's TSIH and CIDs 1-3), carry
//! a verify workload (writes of distinct patterns, then every block read back) in one CmdSN
//! window; a fifth connection is refused (0x0206) mid-session and the four go on serving.
//! The socket loop here is the test's own (the tokio driver of `ipsan-initiator` does not
//! spread over connections yet).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod robust_common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use iscsi_proto::engine::initiator::{self, Command, Connection, Data};
use iscsi_proto::engine::mcs::{self, Spread};
use iscsi_proto::login::originator::{
    Join, LoginDone, LoginExchange, LoginMachine, LoginOptions, LoginProgress, OriginatorError,
    SessionKind,
};
use iscsi_wire::{Codec, Pdu};
use robust_common::{config, read16_cdb, write16_cdb, INITIATOR, IQN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const ISID: [u8; 6] = [0x80, 0, 0, 0, 0x28, 4];
const MRDSL: u32 = 256 * 1024;

fn codec() -> Codec {
    Codec {
        max_recv_data_segment_length: MRDSL,
        ..Codec::default()
    }
}

fn options(join: Option<Join>) -> LoginOptions {
    LoginOptions {
        initiator_name: INITIATOR.into(),
        isid: Some(ISID),
        max_connections: 4,
        max_recv_data_segment_length: MRDSL,
        join,
        ..LoginOptions::default()
    }
}

/// One login over a fresh TCP connection: the stream, what the login gave, and bytes the
/// target sent after its last Login Response.
async fn login(
    addr: std::net::SocketAddr,
    join: Option<Join>,
) -> (TcpStream, Result<LoginDone, OriginatorError>, BytesMut) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let kind = SessionKind::Normal {
        target_name: IQN.into(),
    };
    let (m, first) = <LoginMachine>::start(options(join), kind);
    let mut x = LoginExchange::new(m, first, ISID);
    let c = Codec::default();
    let mut buf = BytesMut::new();
    loop {
        while let Some(p) = x.poll_transmit() {
            let mut out = BytesMut::new();
            c.encode(&p, &mut out).unwrap();
            s.write_all(&out).await.unwrap();
        }
        let pdu = loop {
            if let Some(p) = c.decode(&mut buf).unwrap() {
                break p;
            }
            assert_ne!(
                s.read_buf(&mut buf).await.unwrap(),
                0,
                "closed during login"
            );
        };
        match x.handle_pdu(&pdu) {
            Ok(LoginProgress::Send) => {}
            Ok(LoginProgress::Done(d)) => return (s, Ok(d), buf),
            Ok(LoginProgress::RelayChallenge { .. }) => panic!("no relay"),
            Err(e) => return (s, Err(e), buf),
        }
    }
}

/// The engine connection a login leaves (as `ipsan-initiator` makes it).
fn engine_conn(d: &LoginDone) -> Connection {
    let mut c = initiator::Config::new(
        d.established.params.clone(),
        d.exp_cmd_sn,
        d.max_cmd_sn,
        d.exp_stat_sn,
    );
    c.exp_cmd_sn = d.exp_cmd_sn;
    c.nop_interval = None;
    Connection::new(c, Instant::now())
}

/// The connections' sockets around the engine session.
struct Wire {
    writers: Vec<(u16, OwnedWriteHalf)>,
    rx: mpsc::UnboundedReceiver<(u16, Option<Pdu>)>,
    tx: mpsc::UnboundedSender<(u16, Option<Pdu>)>,
}

impl Wire {
    fn attach(&mut self, cid: u16, s: TcpStream, mut buf: BytesMut) {
        let (mut rd, wr) = s.into_split();
        self.writers.push((cid, wr));
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let c = codec();
            loop {
                while let Some(p) = c.decode(&mut buf).unwrap() {
                    let _ = tx.send((cid, Some(p)));
                }
                if rd.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                    let _ = tx.send((cid, None));
                    return;
                }
            }
        });
    }

    async fn flush(&mut self, s: &mut mcs::Session) {
        let c = codec();
        for (cid, w) in &mut self.writers {
            let mut out = BytesMut::new();
            while let Some(p) = s.poll_transmit(*cid) {
                c.encode(&p, &mut out).unwrap();
            }
            if !out.is_empty() {
                w.write_all(&out).await.unwrap();
            }
        }
    }

    /// Runs the session until `want` commands completed; their results by ITT.
    async fn run(
        &mut self,
        s: &mut mcs::Session,
        want: usize,
    ) -> HashMap<u32, initiator::TaskResult> {
        let mut done = HashMap::new();
        while done.len() < want {
            self.flush(s).await;
            let (cid, pdu) = tokio::time::timeout(Duration::from_secs(10), self.rx.recv())
                .await
                .expect("the target answers")
                .expect("readers live");
            match pdu {
                Some(p) => s.handle_pdu(cid, Instant::now(), p),
                None => panic!("connection {cid} closed"),
            }
            while let Some(ev) = s.poll_event() {
                match ev {
                    mcs::Event::Completed { itt, result, .. } => {
                        assert!(done.insert(itt, result).is_none(), "twice: {itt:#x}");
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
        done
    }
}

fn block_pattern(k: u64, len: usize) -> Bytes {
    (0..len as u64)
        .map(|i| (k.wrapping_mul(31) ^ i ^ (i >> 8)) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_a_verify_workload_over_four_connections_and_a_refused_fifth_leaves_them_serving() {
    let c = config(&["mem:64MiB"], "");
    let t = ipsan_target::ServerHandle::start(&c).await.unwrap();
    let addr = t.addrs[0];
    let (s0, lead, buf) = login(addr, None).await;
    let lead = lead.unwrap();
    assert_eq!(lead.established.params.max_connections, 4);
    let tsih = lead.established.tsih;
    let mut s = mcs::Session::new(
        mcs::Config {
            spread: Spread::LeastBytes,
            command_timeout: None,
        },
        0,
        engine_conn(&lead),
    );
    let (tx, rx) = mpsc::unbounded_channel();
    let mut wire = Wire {
        writers: Vec::new(),
        rx,
        tx,
    };
    wire.attach(0, s0, buf);
    for cid in 1..4u16 {
        let (sock, done, buf) = login(addr, Some(Join { tsih, cid })).await;
        let done = done.unwrap();
        assert_eq!(done.established.tsih, tsih, "joined the session");
        s.add_connection(Instant::now(), cid, engine_conn(&done))
            .unwrap();
        wire.attach(cid, sock, buf);
    }
    assert_eq!(t.registry().sessions().len(), 1);

    // Writes of 64 KiB, each its own pattern, spread over the four connections.
    const N: u64 = 48;
    const BLOCKS: u32 = 128;
    let len = BLOCKS as usize * 512;
    let mut on = [0usize; 4];
    let mut itts = Vec::new();
    for k in 0..N {
        let itt = s
            .submit(
                Instant::now(),
                Command {
                    lun: 0,
                    cdb: write16_cdb(k * u64::from(BLOCKS), BLOCKS, false),
                    data: Data::Write(block_pattern(k, len)),
                    timed: false,
                },
            )
            .unwrap();
        if let Some(cid) = s.allegiance(itt) {
            on[usize::from(cid)] += 1;
        }
        itts.push(itt);
    }
    let done = wire.run(&mut s, N as usize).await;
    for itt in &itts {
        let r = done[itt].as_ref().unwrap();
        assert_eq!(r.status, 0, "write {itt:#x}");
    }
    assert!(
        on.iter().all(|n| *n > 0),
        "every connection carried writes: {on:?}"
    );

    // A fifth connection: MaxConnections=4, refused after it logged in (0x0206).
    let (_s5, refused, _) = login(addr, Some(Join { tsih, cid: 4 })).await;
    match refused {
        Err(OriginatorError::Refused { class, detail }) => assert_eq!((class, detail), (2, 6)),
        other => panic!("{other:?}"),
    }

    // Every block read back, over the four, after the refusal.
    let mut reads = Vec::new();
    for k in 0..N {
        let itt = s
            .submit(
                Instant::now(),
                Command {
                    lun: 0,
                    cdb: read16_cdb(k * u64::from(BLOCKS), BLOCKS),
                    data: Data::Read {
                        buf: BytesMut::new(),
                        len: len as u32,
                    },
                    timed: false,
                },
            )
            .unwrap();
        reads.push((k, itt));
    }
    let done = wire.run(&mut s, N as usize).await;
    for (k, itt) in reads {
        let r = done[&itt].as_ref().unwrap();
        assert_eq!(r.status, 0);
        assert!(
            r.data[..] == block_pattern(k, len)[..],
            "block run {k} read back different"
        );
    }
    assert_eq!(s.open_connections(), 4);
    assert_eq!(t.registry().sessions()[0].connections, 4);
    t.shutdown().await.unwrap();
}
