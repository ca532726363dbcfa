//! The controller's queues a session uses now ([`Links`]) and where its callers find them
//! ([`CurrentLinks`]): one shared copy, and one copy per thread that runs I/O queues
//! (`super::NvmeConfig::queue_runtimes`). Every command looks its queues up; with one copy,
//! callers on two threads took its lock and counted a reference on the same two cache lines
//! per command, which then moved between the CPUs with every command.

use std::sync::{Arc, OnceLock, RwLock};
use std::thread::ThreadId;

use tokio_util::sync::CancellationToken;

use super::queue::QueueHandle;

/// One controller's queues: the admin queue, the I/O queues, and what ends them. A clone
/// shares them (the queues and the token are handles).
#[derive(Debug, Clone)]
pub(super) struct Links {
    pub(super) admin: QueueHandle,
    pub(super) io: Vec<QueueHandle>,
    pub(super) cancel: CancellationToken,
    /// Why the keep-alive failed, set once when it does. Every command looks: a `OnceLock`'s
    /// read is one atomic load, so callers on several threads write no shared cache line per
    /// command (a `Mutex` taken per command was two atomic writes to one line for both).
    pub(super) keepalive_error: Arc<OnceLock<String>>,
    /// 0 for the first controller, one more for each reconnect.
    pub(super) gen: u64,
}

impl Links {
    /// Whether the controller is lost: its keep-alive failed or a queue's connection ended.
    pub(super) fn dead(&self) -> bool {
        self.keepalive_error.get().is_some()
            || self.admin.is_ended()
            || self.io.iter().any(QueueHandle::is_ended)
    }

    /// The threads the I/O queues' tasks run on, each once, in queue order.
    fn homes(&self) -> Vec<ThreadId> {
        let mut homes: Vec<ThreadId> = Vec::new();
        for q in &self.io {
            if !homes.contains(&q.home) {
                homes.push(q.home);
            }
        }
        homes
    }
}

/// A thread's own copy of the current [`Links`], alone in its cache lines.
#[derive(Debug)]
#[repr(align(128))]
struct Local {
    thread: ThreadId,
    links: RwLock<Arc<Links>>,
}

/// The session's current [`Links`]: replaced by a reconnect, read by every command.
#[derive(Debug)]
pub(super) struct CurrentLinks {
    shared: RwLock<Arc<Links>>,
    /// With queue runtimes: a copy for each thread that runs I/O queues, which the callers on
    /// that thread read (their lock and reference count are written by that thread only).
    local: Vec<Local>,
}

fn read(l: &RwLock<Arc<Links>>) -> Arc<Links> {
    match l.read() {
        Ok(g) => Arc::clone(&g),
        Err(p) => Arc::clone(&p.into_inner()),
    }
}

fn write(l: &RwLock<Arc<Links>>, links: Arc<Links>) {
    match l.write() {
        Ok(mut g) => *g = links,
        Err(p) => *p.into_inner() = links,
    }
}

impl CurrentLinks {
    /// `links`, with a copy per thread of its I/O queues when `per_thread` (the session has
    /// queue runtimes).
    pub(super) fn new(links: Links, per_thread: bool) -> Self {
        let local = if per_thread {
            links
                .homes()
                .into_iter()
                .map(|thread| Local {
                    thread,
                    links: RwLock::new(Arc::new(links.clone())),
                })
                .collect()
        } else {
            Vec::new()
        };
        Self {
            shared: RwLock::new(Arc::new(links)),
            local,
        }
    }

    /// The current links: the calling thread's copy when it has one.
    pub(super) fn get(&self) -> Arc<Links> {
        if !self.local.is_empty() {
            let me = std::thread::current().id();
            if let Some(l) = self.local.iter().find(|l| l.thread == me) {
                return read(&l.links);
            }
        }
        read(&self.shared)
    }

    /// Replaces the links (a reconnect) everywhere. The threads keep their places: a new
    /// controller's queues run on the same runtimes.
    pub(super) fn set(&self, links: Links) {
        for l in &self.local {
            write(&l.links, Arc::new(links.clone()));
        }
        write(&self.shared, Arc::new(links));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_copy_sits_alone_in_its_cache_lines() {
        assert_eq!(std::mem::align_of::<Local>(), 128);
        assert_eq!(std::mem::size_of::<Local>() % 128, 0);
    }
}
