//! Threads of their own for NVMe/TCP connections (issue 30): each runs a current-thread tokio
//! runtime, and a connection runs wholly on one of them, its socket registered with that
//! thread's reactor, so its reads, its inline store work and its writes never wake another
//! thread. On the target's multi-thread runtime the two I/O queues of a host woke each other's
//! worker (`futex` 0.035 per 4 KiB write, docs/results/nvme-speed-9), as ipsan's host found and
//! removed on its side with a runtime per queue (docs/results/nvme-speed-6).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::warn;

/// A connection's work, sent to a thread.
type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The threads, and which one takes the next connection.
#[derive(Debug)]
pub(super) struct Pool {
    threads: Vec<mpsc::UnboundedSender<Job>>,
    next: AtomicUsize,
}

impl Pool {
    /// `n` threads (at least one). Each runs until the pool is dropped and its connections
    /// have ended.
    ///
    /// # Errors
    /// A runtime or thread that could not be made.
    pub(super) fn new(n: usize) -> std::io::Result<Self> {
        let mut threads = Vec::new();
        for i in 0..n.max(1) {
            let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            std::thread::Builder::new()
                .name(format!("nvme-conn-{i}"))
                .spawn(move || {
                    rt.block_on(async move {
                        let mut conns = JoinSet::new();
                        loop {
                            tokio::select! {
                                job = rx.recv() => match job {
                                    Some(job) => drop(conns.spawn(job)),
                                    None => break,
                                },
                                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                            }
                        }
                        while conns.join_next().await.is_some() {}
                    });
                })?;
            threads.push(tx);
        }
        Ok(Self {
            threads,
            next: AtomicUsize::new(0),
        })
    }

    /// Runs `job` on the next thread in turn; the returned future ends when it has (or at
    /// once, when the thread is gone).
    pub(super) fn run<F>(&self, job: F) -> impl Future<Output = ()> + Send + 'static
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.threads.len();
        let (done, ended) = oneshot::channel::<()>();
        let sent = self.threads[i]
            .send(Box::pin(async move {
                job.await;
                let _ = done.send(());
            }))
            .is_ok();
        async move {
            if sent {
                let _ = ended.await;
            }
        }
    }
}

/// `conn` serving `stream`: on the next thread of `pool` (the socket taken off this runtime's
/// reactor and registered on that thread's), or here without a pool.
pub(super) fn serve_on<F, Fut>(
    pool: Option<&Pool>,
    stream: TcpStream,
    conn: F,
) -> Pin<Box<dyn Future<Output = ()> + Send>>
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(pool) = pool else {
        return Box::pin(conn(stream));
    };
    let std = match stream.into_std() {
        Ok(s) => s,
        Err(e) => {
            warn!("NVMe/TCP connection not handed to its thread: {e}");
            return Box::pin(async {});
        }
    };
    Box::pin(pool.run(async move {
        match TcpStream::from_std(std) {
            Ok(s) => conn(s).await,
            Err(e) => warn!("NVMe/TCP connection not registered on its thread: {e}"),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Connections run on the pool's threads in turn, never on the caller's; `run`'s future
    /// ends when its job has; a socket handed over with `serve_on` is served on its thread.
    #[tokio::test]
    async fn runs_connections_on_its_threads_in_turn() {
        let pool = Pool::new(2).unwrap();
        let mut names = Vec::new();
        for _ in 0..4 {
            let (tx, rx) = oneshot::channel();
            pool.run(async move {
                let _ = tx.send(std::thread::current().name().map(str::to_owned));
            })
            .await;
            names.push(rx.await.unwrap().unwrap_or_default());
        }
        assert_eq!(
            names,
            ["nvme-conn-0", "nvme-conn-1", "nvme-conn-0", "nvme-conn-1"]
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"ping").await.unwrap();
            let mut back = [0u8; 4];
            c.read_exact(&mut back).await.unwrap();
            back
        });
        let (s, _) = listener.accept().await.unwrap();
        serve_on(Some(&pool), s, |mut s| async move {
            let on = std::thread::current().name().map(str::to_owned);
            assert!(
                on.as_deref().is_some_and(|n| n.starts_with("nvme-conn-")),
                "{on:?}"
            );
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await.unwrap();
            s.write_all(&b).await.unwrap();
        })
        .await;
        assert_eq!(&client.await.unwrap(), b"ping");
    }
}
