//! `ipsan tcp`: register, remove and list the storage-friendly congestion controls
//! (`ipsan_sf`, `ipsan_sf_ss`; papers/002 §4), and check what a socket gets.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;

use anyhow::Context;
use ipsan_tcp::bpf;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: TcpCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum TcpCommand {
    /// Register ipsan_sf and ipsan_sf_ss (BPF struct_ops) until `ipsan tcp unload`. Needs root.
    Load(PinArgs),
    /// Unregister them and remove their bpffs pins. Open sockets keep theirs until closed.
    Unload(PinArgs),
    /// Show the kernel's congestion controls and which are ipsan's.
    List {
        #[command(flatten)]
        pin: PinArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Open a loopback connection with these settings and print what is in force.
    Probe {
        /// Congestion control to select (e.g. ipsan_sf, reno, cubic, bbr).
        #[arg(long)]
        congestion: String,
        /// SO_SNDBUF request: bytes, 8MiB, auto or kernel.
        #[arg(long, default_value = "kernel")]
        sndbuf: ipsan_tcp::BufSize,
        /// SO_RCVBUF request: bytes, 8MiB, auto or kernel.
        #[arg(long, default_value = "kernel")]
        rcvbuf: ipsan_tcp::BufSize,
    },
}

#[derive(Debug, clap::Args)]
pub struct PinArgs {
    /// bpffs directory for the pinned struct_ops maps.
    #[arg(long, default_value = bpf::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        TcpCommand::Load(p) => {
            let report = bpf::load(&p.pin_dir).map_err(with_fallback_hint)?;
            for name in &report.registered {
                println!("registered {name}");
            }
            for name in &report.already {
                println!("{name} was already registered");
            }
            for path in &report.pinned {
                println!("pinned {}", path.display());
            }
            Ok(())
        }
        TcpCommand::Unload(p) => {
            let report = bpf::unload(&p.pin_dir)?;
            for name in &report.unregistered {
                println!("unregistered {name}");
            }
            for name in &report.absent {
                println!("{name} was not registered");
            }
            Ok(())
        }
        TcpCommand::List { pin, json } => {
            let l = bpf::list(&pin.pin_dir)?;
            if json {
                println!("{}", ipsan_tcp::to_json_pretty(&l)?);
                return Ok(());
            }
            println!("available: {}", l.available.join(" "));
            if let Some(d) = &l.default {
                println!("default:   {d} (ipsan sets the algorithm per socket)");
            }
            for o in &l.ours {
                let state = if o.registered {
                    "registered"
                } else {
                    "not loaded"
                };
                match &o.pinned {
                    Some(p) => println!(
                        "ours:      {:<12} {state}, pinned at {}",
                        o.name,
                        p.display()
                    ),
                    None => println!("ours:      {:<12} {state}", o.name),
                }
            }
            if let Some(why) = &l.unavailable {
                println!("note:      {why}");
            }
            Ok(())
        }
        TcpCommand::Probe {
            congestion,
            sndbuf,
            rcvbuf,
        } => {
            let settings = ipsan_tcp::TcpSettings {
                congestion: Some(congestion),
                sndbuf,
                rcvbuf,
                nodelay: Some(true),
                link: None,
            };
            let listener = TcpListener::bind("127.0.0.1:0").context("binding loopback")?;
            let stream = TcpStream::connect(listener.local_addr()?).context("connecting")?;
            let in_force = settings.apply(&stream)?;
            let tcp_info = ipsan_tcp::tcp_info(&stream)?;
            let probe = ipsan_tcp::Probe { in_force, tcp_info };
            println!("{}", ipsan_tcp::to_json_pretty(&probe)?);
            Ok(())
        }
    }
}

fn with_fallback_hint(e: ipsan_tcp::TcpError) -> anyhow::Error {
    let builtins = ipsan_tcp::available_congestion_controls()
        .map(|a| a.join(" "))
        .unwrap_or_else(|_| "reno cubic".into());
    anyhow::anyhow!("{e}\nthe built-in algorithms remain available: {builtins}; sockets asking for ipsan_sf* fall back to reno")
}
