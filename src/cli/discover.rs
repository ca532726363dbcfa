//! `ipsan discover iscsi://host[:port]`: SendTargets discovery (RFC 7143 Appendix C).

use anyhow::Context;

/// List the targets a portal offers.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// iscsi://[user[%password]@]host[:port]
    pub url: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: super::bench::ConnArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
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
