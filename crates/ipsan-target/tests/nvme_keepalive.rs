//! Keep-alive through the real target: a controller whose host sends Keep Alive within KATO
//! lives on; once the host stops, the controller fails when KATO runs out (NVMe Base 2.0
//! §3.9) and the target closes its admin and I/O connections. This is the driver's timer
//! task and its delivery of the controller's events to the connections.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod nvme_common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use nvme_common::{start, Host, NQN};
use nvme_wire::entry::{Sgl, Sqe, Status};
use nvme_wire::fabrics::CNTLID_DYNAMIC;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closes_a_controller_whose_host_stops_sending_keep_alive() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let h = start("1MiB").await;
        let addr = h.nvme_addrs[0];
        let mut admin = Host::connect(addr, false, false).await;
        let c = admin
            .fabrics_connect_kato(0, CNTLID_DYNAMIC, NQN, 1000)
            .await;
        assert_eq!(c.status, Status::SUCCESS);
        let cntlid = (c.dw0 & 0xffff) as u16;
        assert_eq!(admin.enable().await.status, Status::SUCCESS);
        let mut io = Host::connect(addr, false, false).await;
        assert_eq!(
            io.fabrics_connect(1, cntlid, NQN).await.status,
            Status::SUCCESS
        );

        // Keep Alive every 300 ms for 2.5 s: more than KATO, and the controller lives.
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(2500) {
            let cid = admin.cid();
            let ka = Sqe::new(0x18, cid, Sgl::Transport { length: 0 });
            let (c, _) = admin.command(ka, Bytes::new()).await;
            assert_eq!(c.status, Status::SUCCESS, "Keep Alive");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert_eq!(io.read(1, 0, 512).await.0.status, Status::SUCCESS);

        // Silence on the admin queue: both connections are closed within KATO and a margin.
        let stopped = Instant::now();
        assert!(admin.until_closed().await.is_empty());
        assert!(io.until_closed().await.is_empty());
        let took = stopped.elapsed();
        assert!(
            took >= Duration::from_millis(700) && took < Duration::from_secs(4),
            "closed after {took:?}"
        );
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
