//! `ipsan discover iscsi://host[:port]`: SendTargets discovery (RFC 7143 Appendix C);
//! `ipsan discover nvme+tcp://host[:port]`: the Discovery log page of an NVMe/TCP discovery
//! controller (NVMe over Fabrics 1.1 §5.3; port 8009 unless given).

use anyhow::Context;

/// List the targets a portal offers.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// iscsi://[user[%password]@]host[:port] or nvme+tcp://host[:port]
    pub url: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: super::bench::ConnArgs,
    #[command(flatten)]
    pub nvme: super::nvme::NvmeArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if ipsan_initiator::nvme::NvmeUrl::is_nvme(&args.url) {
        return rt.block_on(nvme(args));
    }
    args.nvme.refuse_for_iscsi()?;
    rt.block_on(async {
        let (url, cfg) = args.conn.config(&args.url)?;
        let targets = ipsan_initiator::discover(&url, &cfg)
            .await
            .with_context(|| format!("discovery at {url}"))?;
        if args.json {
            println!("{}", ipsan_initiator::session::targets_json(&targets)?);
        } else {
            for t in &targets {
                if t.addresses.is_empty() {
                    println!("{}", t.name);
                }
                for a in &t.addresses {
                    println!("{a} {}", t.name);
                }
            }
        }
        Ok(())
    })
}

/// One line per Discovery log entry (`trtype addr:port subsystem [subtype, secure channel]`),
/// or the entries as JSON.
async fn nvme(args: Args) -> anyhow::Result<()> {
    let (url, cfg) = args.nvme.config(&args.url, &args.conn)?;
    let (info, entries) = ipsan_initiator::nvme::discover(&url, &cfg)
        .await
        .with_context(|| format!("discovery at {url}"))?;
    let trtype = |t: u8| match t {
        3 => "tcp",
        1 => "rdma",
        2 => "fc",
        _ => "other",
    };
    let treq = |t: u8| match t & 3 {
        1 => "tls required",
        2 => "tls not required",
        _ => "tls not specified",
    };
    if args.json {
        let list: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "trtype": trtype(e.trtype),
                    "adrfam": e.adrfam,
                    "subtype": e.subtype_name(),
                    "treq": e.treq,
                    "portid": e.portid,
                    "cntlid": e.cntlid,
                    "asqsz": e.asqsz,
                    "traddr": e.traddr,
                    "trsvcid": e.trsvcid,
                    "subnqn": e.subnqn,
                    "sectype": e.sectype,
                })
            })
            .collect();
        let doc = serde_json::json!({ "genctr": info.genctr, "entries": list });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for e in &entries {
            let addr = if e.traddr.contains(':') {
                format!("[{}]:{}", e.traddr, e.trsvcid)
            } else {
                format!("{}:{}", e.traddr, e.trsvcid)
            };
            println!(
                "{} {addr} {} [{}, port {}, {}]",
                trtype(e.trtype),
                e.subnqn,
                e.subtype_name(),
                e.portid,
                treq(e.treq)
            );
        }
    }
    Ok(())
}
