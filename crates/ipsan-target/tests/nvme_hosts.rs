//! Per-subsystem host lists (issue 30, docs/nvme.md "Host lists"): `[[nvme.subsystem]] hosts`
//! names the host NQNs that may connect to a subsystem; any other host's Connect is refused
//! with Connect Invalid Host (NVMe over Fabrics 1.1 §3.3). The list changes live through the
//! control socket's `nvme.hosts` (what `ipsan ctl nvme hosts` sends): a host taken off it
//! loses its controller at once, a host put on it connects without a restart. The metrics
//! count Connects per subsystem, host and result.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod nvme_common;

use std::time::Duration;

use nvme_common::{Host, IQN, NQN};
use nvme_wire::entry::Status;
use nvme_wire::fabrics::CNTLID_DYNAMIC;

const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-0000-4000-8000-00000000000a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-0000-4000-8000-00000000000b";

async fn connect_as(addr: std::net::SocketAddr, host: &str) -> (Host, Status) {
    let mut h = Host::connect(addr, false, false).await;
    let c = h
        .fabrics_connect_as(0, CNTLID_DYNAMIC, NQN, host, 30_000)
        .await;
    (h, c.status)
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series))
        .map_or(0.0, |l| l.rsplit(' ').next().unwrap().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_hosts_off_the_list_and_follows_live_changes() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let toml = format!(
            "[server]\nportals = [\"127.0.0.1:0\"]\n[nvme]\nlisten = [\"127.0.0.1:0\"]\n\
             [[nvme.subsystem]]\ntarget = \"{IQN}\"\nhosts = [\"{HOST_A}\"]\n\
             [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n"
        );
        let c = ipsan_target::Config::from_toml(&toml).unwrap();
        let h = ipsan_target::ServerHandle::start(&c).await.unwrap();
        let addr = h.nvme_addrs[0];

        // B is not on the list: refused, IPO at HOSTNQN; A is.
        let (_b, s) = connect_as(addr, HOST_B).await;
        assert_eq!(s, Status::CONNECT_INVALID_HOST, "host B is not listed");
        let (mut a, s) = connect_as(addr, HOST_A).await;
        assert_eq!(s, Status::SUCCESS, "host A is listed");
        assert_eq!(a.enable().await.status, Status::SUCCESS);

        // The list changed live, as `ipsan ctl nvme hosts NQN HOST_B` sends it.
        let req = serde_json::json!({
            "jsonrpc": "2.0", "id": 1, "method": "nvme.hosts",
            "params": {"subsystem": NQN, "hosts": [HOST_B]},
        });
        let answer = ipsan_target::control::handle_line(
            &h.registry(),
            serde_json::to_string(&req).unwrap().as_bytes(),
        );
        assert!(answer.get("error").is_none(), "{answer}");
        // A's controller is closed: its connection ends without another command.
        let left = tokio::time::timeout(Duration::from_secs(10), a.until_closed())
            .await
            .expect("host A's connection is closed within 10 s");
        assert!(
            !left
                .iter()
                .any(|p| matches!(p, nvme_wire::pdu::Pdu::CapsuleResp(_))),
            "{left:?}"
        );
        let (_a2, s) = connect_as(addr, HOST_A).await;
        assert_eq!(s, Status::CONNECT_INVALID_HOST, "host A is no longer listed");
        let (mut b, s) = connect_as(addr, HOST_B).await;
        assert_eq!(s, Status::SUCCESS, "host B is listed now, without a restart");
        assert_eq!(b.enable().await.status, Status::SUCCESS);

        // The running configuration and `ipsan ctl nvme` show the new list.
        let running = h.registry().running_config().unwrap();
        assert_eq!(running.nvme.subsystem[0].hosts, vec![HOST_B.to_owned()]);
        let status = ipsan_target::control::handle_line(
            &h.registry(),
            br#"{"jsonrpc":"2.0","id":2,"method":"nvme"}"#,
        );
        assert_eq!(
            status["result"]["subsystems"][0]["hosts"],
            serde_json::json!([HOST_B]),
            "{status}"
        );

        // Per host and result in the metrics.
        let text = ipsan_target::scrape::render(&h.registry());
        let series = |host: &str, result: &str| {
            format!(
                "ipsan_nvme_host_connects_total{{subsystem=\"{NQN}\",host=\"{host}\",result=\"{result}\"}}"
            )
        };
        assert_eq!(metric(&text, &series(HOST_A, "accepted")), 1.0, "{text}");
        assert_eq!(metric(&text, &series(HOST_A, "refused_host")), 1.0);
        assert_eq!(metric(&text, &series(HOST_B, "refused_host")), 1.0);
        assert_eq!(metric(&text, &series(HOST_B, "accepted")), 1.0);

        // An empty list: every host again.
        let req = serde_json::json!({
            "jsonrpc": "2.0", "id": 3, "method": "nvme.hosts",
            "params": {"subsystem": IQN, "hosts": []},
        });
        let answer = ipsan_target::control::handle_line(
            &h.registry(),
            serde_json::to_string(&req).unwrap().as_bytes(),
        );
        assert!(answer.get("error").is_none(), "{answer}");
        let (_a3, s) = connect_as(addr, HOST_A).await;
        assert_eq!(s, Status::SUCCESS, "no list: any host");
        assert!(h.registry().running_config().unwrap().nvme.subsystem.is_empty());

        // An unknown subsystem is refused, naming the parameter.
        let answer = ipsan_target::control::handle_line(
            &h.registry(),
            br#"{"jsonrpc":"2.0","id":4,"method":"nvme.hosts","params":{"subsystem":"nqn.2026-11.x:none","hosts":[]}}"#,
        );
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("params.subsystem")),
            "{answer}"
        );
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
