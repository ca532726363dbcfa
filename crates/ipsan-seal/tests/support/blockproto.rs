//! A toy block protocol over TCP that carries Seal-framed data exactly as iSCSI will
//! (sealed bytes in, sealed bytes out, the transfer length = `sealed_len(plain)`), so Seal can be
//! tested end to end and measured before the iSCSI target/initiator integrate it. It is NOT
//! iSCSI: one request frame per command, no R2T, no digests.
//!
//! request  = op(1: 1 write, 2 read) | task_tag(4) | lba(8) | blocks(4) | len(4) | payload
//! response = task_tag(4) | status(1) | sense key(1) | asc(1) | ascq(1) | len(4) | payload
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]
// `start_write` deliberately yields the reply receiver: sending and awaiting the reply are separate steps.
#![allow(clippy::async_yields_async)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use ipsan_seal::{sense, Binding, CryptoPool, SealSession};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};

pub const BLOCK: usize = 512;
const OP_WRITE: u8 = 1;
const OP_READ: u8 = 2;

/// Seal state of one side: `None` = plain session.
#[derive(Clone)]
pub struct Sealing {
    pub session: Arc<SealSession>,
    pub pool: Arc<CryptoPool>,
    /// `false`: seal/open inline on the network task (the papers' "without optimization").
    pub pipeline: bool,
}

fn binding(op: u8, tag: u32, lba: u64, blocks: u32) -> Binding {
    Binding {
        lun: 0,
        lba,
        blocks,
        opcode: if op == OP_WRITE { 0x8a } else { 0x88 },
        task_tag: tag,
    }
}

/// Seals (or passes through) on the pool or inline.
async fn seal(s: &Option<Sealing>, b: Binding, data: BytesMut) -> Bytes {
    match s {
        None => data.freeze(),
        Some(s) if s.pipeline => s.pool.seal(&s.session, b, data).await.unwrap(),
        Some(s) => s.session.seal(&b, data).unwrap(),
    }
}

async fn open(
    s: &Option<Sealing>,
    b: Binding,
    data: BytesMut,
) -> Result<Bytes, ipsan_seal::OpenError> {
    match s {
        None => Ok(data.freeze()),
        Some(s) if s.pipeline => s.pool.open(&s.session, b, data).await,
        Some(s) => s.session.open(&b, data),
    }
}

// ---------------------------------------------------------------- server

/// An in-memory LUN served on loopback. Returns the bound address and the LUN.
pub async fn serve(
    sealing: Option<Sealing>,
    lun_bytes: usize,
) -> (std::net::SocketAddr, Arc<Mutex<Vec<u8>>>) {
    serve_delayed(sealing, lun_bytes, std::time::Duration::ZERO).await
}

/// As [`serve`], but every response waits `delay` before it is sent (a crude stand-in for a
/// long link's round trip, to show what pipelining hides).
pub async fn serve_delayed(
    sealing: Option<Sealing>,
    lun_bytes: usize,
    delay: std::time::Duration,
) -> (std::net::SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let lun = Arc::new(Mutex::new(vec![0u8; lun_bytes]));
    let l2 = Arc::clone(&lun);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            sock.set_nodelay(true).unwrap();
            tokio::spawn(serve_conn(sock, sealing.clone(), Arc::clone(&l2), delay));
        }
    });
    (addr, lun)
}

async fn serve_conn(
    sock: TcpStream,
    sealing: Option<Sealing>,
    lun: Arc<Mutex<Vec<u8>>>,
    delay: std::time::Duration,
) {
    let (mut rd, wr) = sock.into_split();
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(writer(wr, rx));
    loop {
        let mut h = [0u8; 21];
        if rd.read_exact(&mut h).await.is_err() {
            return;
        }
        let op = h[0];
        let tag = u32::from_be_bytes(h[1..5].try_into().unwrap());
        let lba = u64::from_be_bytes(h[5..13].try_into().unwrap());
        let blocks = u32::from_be_bytes(h[13..17].try_into().unwrap());
        let len = u32::from_be_bytes(h[17..21].try_into().unwrap()) as usize;
        let mut payload = BytesMut::zeroed(len);
        if rd.read_exact(&mut payload).await.is_err() {
            return;
        }
        let inline = matches!(&sealing, Some(s) if !s.pipeline);
        let (sealing, lun, tx) = (sealing.clone(), Arc::clone(&lun), tx.clone());
        let b = binding(op, tag, lba, blocks);
        // Each command is handled on its own task, so opening one command's data overlaps
        // receiving the next.
        let work = async move {
            let start = lba as usize * BLOCK;
            let n = blocks as usize * BLOCK;
            let resp = if op == OP_WRITE {
                match open(&sealing, b, payload).await {
                    Ok(plain) if plain.len() == n => {
                        lun.lock().unwrap()[start..start + n].copy_from_slice(&plain);
                        response(tag, None, Bytes::new())
                    }
                    _ => response(
                        tag,
                        Some((sense::SENSE_KEY, sense::ASC, sense::ASCQ)),
                        Bytes::new(),
                    ),
                }
            } else {
                let mut data = BytesMut::with_capacity(n + 4096);
                data.extend_from_slice(&lun.lock().unwrap()[start..start + n]);
                let sealed = seal(&sealing, b, data).await;
                response(tag, None, sealed)
            };
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let _ = tx.send(resp).await;
        };
        if inline {
            work.await;
        } else {
            tokio::spawn(work);
        }
    }
}

fn response(tag: u32, check: Option<(u8, u8, u8)>, payload: Bytes) -> Bytes {
    let mut r = BytesMut::with_capacity(12 + payload.len());
    r.extend_from_slice(&tag.to_be_bytes());
    match check {
        None => r.extend_from_slice(&[0, 0, 0, 0]),
        Some((k, a, q)) => r.extend_from_slice(&[sense::STATUS, k, a, q]),
    }
    r.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    r.extend_from_slice(&payload);
    r.freeze()
}

async fn writer(mut wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Bytes>) {
    while let Some(b) = rx.recv().await {
        if wr.write_all(&b).await.is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------- client

/// The outcome of one command.
#[derive(Debug)]
pub struct Reply {
    pub status: u8,
    pub sense: (u8, u8, u8),
    pub payload: BytesMut,
}

/// A client connection: commands are tagged, many may be in flight.
pub struct Client {
    wr: tokio::sync::Mutex<OwnedWriteHalf>,
    waiting: Arc<Mutex<HashMap<u32, oneshot::Sender<Reply>>>>,
    pub sealing: Option<Sealing>,
    next_tag: std::sync::atomic::AtomicU32,
}

impl Client {
    pub async fn connect(addr: std::net::SocketAddr, sealing: Option<Sealing>) -> Arc<Client> {
        let sock = TcpStream::connect(addr).await.unwrap();
        sock.set_nodelay(true).unwrap();
        let (rd, wr) = sock.into_split();
        let waiting = Arc::new(Mutex::new(HashMap::new()));
        tokio::spawn(reader(rd, Arc::clone(&waiting)));
        Arc::new(Client {
            wr: tokio::sync::Mutex::new(wr),
            waiting,
            sealing,
            next_tag: 1.into(),
        })
    }

    fn tag(&self) -> u32 {
        self.next_tag
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    async fn send(
        &self,
        op: u8,
        tag: u32,
        lba: u64,
        blocks: u32,
        payload: &[u8],
    ) -> oneshot::Receiver<Reply> {
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap().insert(tag, tx);
        let mut h = Vec::with_capacity(21);
        h.push(op);
        h.extend_from_slice(&tag.to_be_bytes());
        h.extend_from_slice(&lba.to_be_bytes());
        h.extend_from_slice(&blocks.to_be_bytes());
        h.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        let mut wr = self.wr.lock().await;
        wr.write_all(&h).await.unwrap();
        wr.write_all(payload).await.unwrap();
        rx
    }

    /// Seals and writes `data` at `lba`; returns the target's reply.
    pub async fn write(&self, lba: u64, data: BytesMut) -> Reply {
        let fut = self.start_write(lba, data);
        fut.await.await.unwrap()
    }

    /// Starts sealing now; the returned future sends once sealed and yields the reply receiver.
    pub fn start_write(
        &self,
        lba: u64,
        data: BytesMut,
    ) -> impl std::future::Future<
        Output = impl std::future::Future<Output = Result<Reply, oneshot::error::RecvError>>,
    > + '_ {
        let tag = self.tag();
        let blocks = (data.len() / BLOCK) as u32;
        let b = binding(OP_WRITE, tag, lba, blocks);
        // Dispatch to the pool immediately (pre-sealing) when pipelining.
        let sealed: std::pin::Pin<Box<dyn std::future::Future<Output = Bytes> + Send>> =
            match &self.sealing {
                Some(s) if s.pipeline => {
                    let f = s.pool.seal(&s.session, b, data);
                    Box::pin(async move { f.await.unwrap() })
                }
                other => {
                    let other = other.clone();
                    Box::pin(async move { seal(&other, b, data).await })
                }
            };
        async move {
            let sealed = sealed.await;
            self.send(OP_WRITE, tag, lba, blocks, &sealed).await
        }
    }

    /// Reads `blocks` at `lba`, opens the data; an error means the data was rejected.
    pub async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, ipsan_seal::OpenError> {
        let rx = self.start_read(lba, blocks).await;
        rx.await
    }

    /// Sends a read now; the returned future completes with the opened data.
    pub async fn start_read(
        &self,
        lba: u64,
        blocks: u32,
    ) -> impl std::future::Future<Output = Result<Bytes, ipsan_seal::OpenError>> + Send + 'static
    {
        let tag = self.tag();
        let rx = self.send(OP_READ, tag, lba, blocks, &[]).await;
        let sealing = self.sealing.clone();
        async move {
            let reply = rx.await.unwrap();
            assert_eq!(reply.status, 0);
            open(&sealing, binding(OP_READ, tag, lba, blocks), reply.payload).await
        }
    }
}

async fn reader(mut rd: OwnedReadHalf, waiting: Arc<Mutex<HashMap<u32, oneshot::Sender<Reply>>>>) {
    loop {
        let mut h = [0u8; 12];
        if rd.read_exact(&mut h).await.is_err() {
            return;
        }
        let tag = u32::from_be_bytes(h[0..4].try_into().unwrap());
        let len = u32::from_be_bytes(h[8..12].try_into().unwrap()) as usize;
        let mut payload = BytesMut::zeroed(len);
        if rd.read_exact(&mut payload).await.is_err() {
            return;
        }
        let reply = Reply {
            status: h[4],
            sense: (h[5], h[6], h[7]),
            payload,
        };
        if let Some(tx) = waiting.lock().unwrap().remove(&tag) {
            let _ = tx.send(reply);
        }
    }
}

// ---------------------------------------------------------------- relay

/// A loopback TCP relay that records every byte in both directions and can flip one byte of the
/// client-to-server stream at a given offset.
pub struct Relay {
    pub addr: std::net::SocketAddr,
    pub client_to_server: Arc<Mutex<Vec<u8>>>,
    pub server_to_client: Arc<Mutex<Vec<u8>>>,
}

pub async fn relay(server: std::net::SocketAddr, flip_at: Option<usize>) -> Relay {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let c2s = Arc::new(Mutex::new(Vec::new()));
    let s2c = Arc::new(Mutex::new(Vec::new()));
    let (c2s2, s2c2) = (Arc::clone(&c2s), Arc::clone(&s2c));
    tokio::spawn(async move {
        let (client, _) = listener.accept().await.unwrap();
        let upstream = TcpStream::connect(server).await.unwrap();
        let (crd, cwr) = client.into_split();
        let (srd, swr) = upstream.into_split();
        tokio::spawn(pump(crd, swr, c2s2, flip_at));
        tokio::spawn(pump(srd, cwr, s2c2, None));
    });
    Relay {
        addr,
        client_to_server: c2s,
        server_to_client: s2c,
    }
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    record: Arc<Mutex<Vec<u8>>>,
    flip_at: Option<usize>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = &mut buf[..n];
        {
            let mut rec = record.lock().unwrap();
            let start = rec.len();
            if let Some(at) = flip_at {
                if (start..start + n).contains(&at) {
                    chunk[at - start] ^= 0x01;
                }
            }
            rec.extend_from_slice(chunk);
        }
        if to.write_all(chunk).await.is_err() {
            return;
        }
    }
}

/// Whether `hay` contains `needle`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Sequential writes of `total` bytes in `io`-sized commands with up to `depth` in flight.
/// Sealing runs ahead of the network by up to `depth` further commands (pre-processing).
pub async fn sequential_write(
    client: &Arc<Client>,
    total: usize,
    io: usize,
    depth: usize,
    fill: u8,
) {
    let sem = Arc::new(Semaphore::new(depth));
    let mut ahead = std::collections::VecDeque::new();
    let mut replies = Vec::new();
    let count = total / io;
    let mut next = 0;
    while next < count || !ahead.is_empty() {
        while next < count && ahead.len() < depth {
            let mut data = BytesMut::with_capacity(io + 4096);
            data.resize(io, fill);
            ahead.push_back(client.start_write((next * io / BLOCK) as u64, data));
            next += 1;
        }
        let permit = Arc::clone(&sem).acquire_owned().await.unwrap();
        let rx = ahead.pop_front().unwrap().await;
        replies.push(tokio::spawn(async move {
            let r = rx.await.unwrap();
            drop(permit);
            assert_eq!(r.status, 0, "write failed: {:?}", r.sense);
        }));
    }
    for r in replies {
        r.await.unwrap();
    }
}

/// Sequential reads of `total` bytes in `io`-sized commands with up to `depth` in flight; checks
/// every byte equals `fill`.
pub async fn sequential_read(
    client: &Arc<Client>,
    total: usize,
    io: usize,
    depth: usize,
    fill: u8,
) {
    let sem = Arc::new(Semaphore::new(depth));
    let mut tasks = Vec::new();
    for i in 0..total / io {
        let permit = Arc::clone(&sem).acquire_owned().await.unwrap();
        let f = client
            .start_read((i * io / BLOCK) as u64, (io / BLOCK) as u32)
            .await;
        tasks.push(tokio::spawn(async move {
            let data = f.await.unwrap();
            drop(permit);
            assert_eq!(data.len(), io);
            assert!(data.iter().all(|&b| b == fill), "read returned wrong data");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}
