//! The initiator's protocol engine for several connections per session
//! (`iscsi_proto::engine::mcs`, issue 28) against the real target over loopback TCP: four
//! connections, each logged in by the real originator login machine (the leading login
//! offering MaxConnections=4, then three joining with the session's TSIH and CIDs 1-3), carry
//! a verify workload (writes of distinct patterns, then every block read back) in one CmdSN
//! window; a fifth connection is refused (0x0206) mid-session and the four go on serving.
//! The same workload sealed: each connection runs its own Seal login (its own CPace, keys and
//! counters), every PDU goes through that connection's record layer, and each command's data
//! is sealed for the connection it is placed on (`pick`, `submit_on`).
//! The socket loop here is the test's own (the tokio driver of `ipsan-initiator` does not
//! spread over connections yet).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod robust_common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ipsan_initiator::login::RecordLayer;
use ipsan_initiator::seal::SealRequest;
use ipsan_initiator::transform::{CommandInfo, PayloadTransform};
use ipsan_initiator::{ExtensionFactory, OriginatorExtension};
use ipsan_seal::{Cipher, Psk, RecordSealer};
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

/// What one login over a fresh TCP connection gave: the stream, the login's result, bytes the
/// target sent after its last Login Response, and (sealed) the connection's own record layer
/// and payload transform.
struct Login {
    s: TcpStream,
    done: Result<LoginDone, OriginatorError>,
    buf: BytesMut,
    record: Option<RecordLayer>,
    transform: Option<Arc<dyn PayloadTransform>>,
}

/// One login; `seal`: a fresh Seal negotiation (its own CPace, keys and counters).
async fn login_with(
    addr: std::net::SocketAddr,
    join: Option<Join>,
    seal: Option<&ExtensionFactory>,
) -> Login {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let kind = SessionKind::Normal {
        target_name: IQN.into(),
    };
    let (mut m, first) = <LoginMachine<dyn OriginatorExtension>>::start(options(join), kind);
    if let Some(f) = seal {
        m.set_extension((f.0)(), ISID);
    }
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
        let done = match x.handle_pdu(&pdu) {
            Ok(LoginProgress::Send) => continue,
            Ok(LoginProgress::Done(d)) => Ok(d),
            Ok(LoginProgress::RelayChallenge { .. }) => panic!("no relay"),
            Err(e) => Err(e),
        };
        let record = x
            .extension_mut()
            .and_then(|e| e.record_layer())
            .transpose()
            .unwrap();
        let transform = x.extension_mut().and_then(|e| e.transform());
        return Login {
            s,
            done,
            buf,
            record,
            transform,
        };
    }
}

async fn login(
    addr: std::net::SocketAddr,
    join: Option<Join>,
) -> (TcpStream, Result<LoginDone, OriginatorError>, BytesMut) {
    let l = login_with(addr, join, None).await;
    (l.s, l.done, l.buf)
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
    writers: Vec<(u16, OwnedWriteHalf, Option<RecordSealer>)>,
    rx: mpsc::UnboundedReceiver<(u16, Option<Pdu>)>,
    tx: mpsc::UnboundedSender<(u16, Option<Pdu>)>,
}

impl Wire {
    fn attach(&mut self, cid: u16, s: TcpStream, mut buf: BytesMut) {
        self.attach_sealed(cid, s, std::mem::take(&mut buf), None);
    }

    /// A connection's sockets; with its record layer, every PDU is protected going out and
    /// verified coming in (a forgery fails the test).
    fn attach_sealed(
        &mut self,
        cid: u16,
        s: TcpStream,
        mut buf: BytesMut,
        record: Option<RecordLayer>,
    ) {
        let (sealer, mut opener) = record.map_or((None, None), |(s, o)| (Some(s), Some(o)));
        let (mut rd, wr) = s.into_split();
        self.writers.push((cid, wr, sealer));
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let c = codec();
            loop {
                while let Some(mut p) = c.decode(&mut buf).unwrap() {
                    if let Some(o) = opener.as_mut() {
                        o.verify(&mut p).unwrap();
                    }
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
        for (cid, w, sealer) in &mut self.writers {
            let mut out = BytesMut::new();
            while let Some(mut p) = s.poll_transmit(*cid) {
                if let Some(r) = sealer.as_mut() {
                    r.protect(&mut p).unwrap();
                }
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

/// The first session's open connections once they are `want` (the target adds a connection
/// right after its last login response: waited for, bounded).
async fn connections(t: &ipsan_target::ServerHandle, want: usize) -> usize {
    let mut n = 0;
    for _ in 0..200 {
        n = t.registry().sessions()[0].connections;
        if n == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    n
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
    assert_eq!(connections(&t, 4).await, 4);
    t.shutdown().await.unwrap();
}

const SECRET: &str = "a-seal-secret-for-four-connections";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_a_sealed_verify_workload_over_four_connections_each_with_its_own_keys() {
    let c = config(
        &["mem:64MiB"],
        &format!("[target.seal]\npolicy = \"required\"\nsecret = \"{SECRET}\"\n"),
    );
    let t = ipsan_target::ServerHandle::start(&c).await.unwrap();
    let addr = t.addrs[0];
    let seal = SealRequest {
        ciphers: vec![Cipher::Aes256Gcm],
        chunk: ipsan_seal::DEFAULT_CHUNK,
        psk: Psk::new(SECRET.as_bytes().to_vec()).unwrap(),
        pool: None,
    }
    .factory();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut wire = Wire {
        writers: Vec::new(),
        rx,
        tx,
    };
    let mut transforms: HashMap<u16, Arc<dyn PayloadTransform>> = HashMap::new();
    let lead = login_with(addr, None, Some(&seal)).await;
    let done = lead.done.unwrap();
    let tsih = done.established.tsih;
    let mut s = mcs::Session::new(mcs::Config::default(), 0, engine_conn(&done));
    transforms.insert(0, lead.transform.expect("sealed"));
    wire.attach_sealed(0, lead.s, lead.buf, lead.record);
    for cid in 1..4u16 {
        let l = login_with(addr, Some(Join { tsih, cid }), Some(&seal)).await;
        let done = l.done.unwrap();
        s.add_connection(Instant::now(), cid, engine_conn(&done))
            .unwrap();
        transforms.insert(cid, l.transform.expect("sealed"));
        wire.attach_sealed(cid, l.s, l.buf, l.record);
    }
    assert_eq!(
        connections(&t, 4).await,
        4,
        "one session of four connections"
    );

    const N: u64 = 32;
    const BLOCKS: u32 = 64;
    let len = BLOCKS as usize * 512;
    let info = |k: u64, opcode: u8, itt: u32| CommandInfo {
        lun: 0,
        lba: k * u64::from(BLOCKS),
        blocks: BLOCKS,
        opcode,
        itt,
    };
    let mut on = [0usize; 4];
    for k in 0..N {
        let cid = s.pick().unwrap();
        on[usize::from(cid)] += 1;
        let itt = s.alloc_itt();
        let sealed = transforms[&cid]
            .outbound(info(k, 0x8a, itt), block_pattern(k, len))
            .await
            .unwrap();
        assert_ne!(&sealed[..], &block_pattern(k, len)[..], "sealed");
        let cmd = Command {
            lun: 0,
            cdb: write16_cdb(k * u64::from(BLOCKS), BLOCKS, false),
            data: Data::Write(sealed),
            timed: false,
        };
        s.submit_on(Instant::now(), cid, itt, cmd).unwrap();
    }
    let done = wire.run(&mut s, N as usize).await;
    assert!(done.values().all(|r| r.as_ref().unwrap().status == 0));
    assert!(on.iter().all(|n| *n > 0), "{on:?}");

    let mut reads = Vec::new();
    for k in 0..N {
        let cid = s.pick().unwrap();
        let itt = s.alloc_itt();
        let wire_len = transforms[&cid].wire_len(len).unwrap() as u32;
        let cmd = Command {
            lun: 0,
            cdb: read16_cdb(k * u64::from(BLOCKS), BLOCKS),
            data: Data::Read {
                buf: BytesMut::new(),
                len: wire_len,
            },
            timed: false,
        };
        s.submit_on(Instant::now(), cid, itt, cmd).unwrap();
        reads.push((k, cid, itt));
    }
    let mut done = wire.run(&mut s, N as usize).await;
    for (k, cid, itt) in reads {
        let r = done.remove(&itt).unwrap().unwrap();
        assert_eq!(r.status, 0);
        let plain = transforms[&cid]
            .inbound(info(k, 0x88, itt), r.data)
            .await
            .unwrap();
        assert!(plain[..] == block_pattern(k, len)[..], "block run {k}");
    }
    t.shutdown().await.unwrap();
}
