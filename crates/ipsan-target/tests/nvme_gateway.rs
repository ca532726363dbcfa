//! Remote (gateway) LUNs as NVMe namespaces (issue 30, docs/nvme.md "Remote LUNs"): a real
//! ipsan target (the far end, iSCSI only) and a real gateway in front of it (a target whose
//! LUN is `iscsi://` the far one, with an NVMe/TCP listener). ipsan's NVMe/TCP host writes
//! through the gateway and the data is verified over iSCSI directly at the far end, and the
//! other way round; the remote namespace refuses reservations (its LU's state is the far
//! target's, which NVMe does not reach).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_initiator::nvme::{NvmeConfig, NvmeError, NvmeSession, NvmeUrl};
use ipsan_initiator::{IscsiUrl, Session, SessionConfig};
use ipsan_target::config::{self, Config, TargetConfig};
use ipsan_target::ServerHandle;
use nvme_wire::entry::Status;

const FAR_IQN: &str = "iqn.2026-11.org.ipsan:far";
const GW_IQN: &str = "iqn.2026-11.org.ipsan:gw";
const GW_NQN: &str = "nqn.2026-11.org.ipsan:gw";
const BS: usize = 512;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

async fn far_target() -> ServerHandle {
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![TargetConfig::new(
            FAR_IQN,
            config::luns_from_specs(&["mem:8MiB".to_owned()]).unwrap(),
        )],
        ..Config::default()
    };
    c.validate().unwrap();
    ServerHandle::start(&c).await.unwrap()
}

async fn gateway(far: &ServerHandle) -> ServerHandle {
    let toml = format!(
        "[server]\nportals = [\"127.0.0.1:0\"]\n[nvme]\nlisten = [\"127.0.0.1:0\"]\n\
         [[target]]\niqn = \"{GW_IQN}\"\n[[target.lun]]\nid = 0\nbackend = \"{}\"\n",
        far.urls[0]
    );
    let c = Config::from_toml(&toml).unwrap();
    ServerHandle::start(&c).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_nvme_io_through_a_gateway_verified_over_iscsi_at_the_far_end() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let far = far_target().await;
        assert!(far.urls[0].ends_with("/0"), "{}", far.urls[0]);
        let gw = gateway(&far).await;
        let url = NvmeUrl::parse(&format!("nvme+tcp://{}/{GW_NQN}/1", gw.nvme_addrs[0])).unwrap();
        let host = NvmeSession::open(&url, &NvmeConfig::default())
            .await
            .unwrap();
        let cap = host.capacity().unwrap();
        assert_eq!(
            cap.blocks * u64::from(cap.block_len),
            8 << 20,
            "the namespace is the far LUN's size"
        );
        let far_iscsi = Session::open(
            &IscsiUrl::parse(&far.urls[0]).unwrap(),
            &SessionConfig {
                command_timeout: Some(Duration::from_secs(30)),
                ..SessionConfig::default()
            },
        )
        .await
        .unwrap();

        // NVMe writes through the gateway (in the capsule, and after an R2T), the far end
        // reads it over iSCSI.
        let small = pattern(2048, 1);
        let big = pattern(256 * 1024, 2);
        host.write(16, Bytes::from(small.clone())).await.unwrap();
        host.write(1000, Bytes::from(big.clone())).await.unwrap();
        host.flush().await.unwrap();
        let got = far_iscsi.read(16, (small.len() / BS) as u32).await.unwrap();
        assert!(
            got[..] == small[..],
            "the far end holds what NVMe wrote (2 KiB)"
        );
        let got = far_iscsi.read(1000, (big.len() / BS) as u32).await.unwrap();
        assert!(
            got[..] == big[..],
            "the far end holds what NVMe wrote (256 KiB)"
        );

        // The far end writes over iSCSI, NVMe reads it through the gateway.
        let back = pattern(64 * 1024, 3);
        far_iscsi
            .write(5000, Bytes::from(back.clone()))
            .await
            .unwrap();
        let got = host
            .read_into(5000, (back.len() / BS) as u32, BytesMut::new())
            .await
            .unwrap();
        assert!(got[..] == back[..], "NVMe reads what the far end wrote");

        // No reservations on a remote namespace (RESCAP 0): Invalid Opcode.
        match host.resv_register(0, false, 0, 1).await {
            Err(NvmeError::Status { status, .. }) => assert_eq!(status, Status::INVALID_OPCODE),
            other => panic!("reservation on a remote namespace: {other:?}"),
        }
        host.close().await.unwrap();
        far_iscsi.logout().await.unwrap();
        gw.shutdown().await.unwrap();
        far.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
