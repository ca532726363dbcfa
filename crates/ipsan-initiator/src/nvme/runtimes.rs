//! Current-thread runtimes on threads of their own, for [`NvmeConfig::queue_runtimes`]
//! (`super::NvmeConfig`): each runs until the [`RuntimeThreads`] that started it is dropped.

use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// `n` threads, each running a current-thread runtime of its own; dropping this stops them
/// and waits for them to end.
#[derive(Debug, Default)]
pub struct RuntimeThreads {
    handles: Vec<Handle>,
    stops: Vec<oneshot::Sender<()>>,
    joins: Vec<JoinHandle<()>>,
}

impl RuntimeThreads {
    /// Starts `n` threads named `{name}-1` … `{name}-n`, each with a current-thread runtime
    /// (I/O and time enabled), and returns once every runtime runs.
    pub fn spawn(n: usize, name: &str) -> std::io::Result<Self> {
        let mut me = Self::default();
        for i in 1..=n {
            let (stop, stopped) = oneshot::channel::<()>();
            let (htx, hrx) = std::sync::mpsc::channel();
            let join = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    if htx.send(rt.handle().clone()).is_ok() {
                        rt.block_on(async {
                            let _ = stopped.await;
                        });
                    }
                })?;
            // Held before the handle is awaited, so a failure below still joins the thread.
            me.stops.push(stop);
            me.joins.push(join);
            let h = hrx.recv().map_err(|_| {
                std::io::Error::other(format!("thread {name}-{i} could not start its runtime"))
            })?;
            me.handles.push(h);
        }
        Ok(me)
    }

    /// The runtimes, in the order of their threads.
    #[must_use]
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }
}

impl Drop for RuntimeThreads {
    fn drop(&mut self) {
        self.stops.clear();
        for j in self.joins.drain(..) {
            let _ = j.join();
        }
    }
}
