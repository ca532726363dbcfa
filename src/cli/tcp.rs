//! `ipsan tcp`: register, remove and list the storage-friendly congestion controls
//! (`ipsan_sf`, `ipsan_sf_ss`, `ipsan_ss`; the iFCP paper (Muknahallipatna et al.) §4), and check
//! what a socket gets.

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
    /// Register ipsan_sf, ipsan_sf_ss and ipsan_ss (BPF struct_ops) until `ipsan tcp unload`.
    /// Needs root.
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
    /// Bulk sender: one connection, prints a JSON result with throughput, the settings in
    /// force and TCP_INFO (the iFCP paper's experiments, Muknahallipatna et al.).
    Send {
        /// Where the sink listens (ip:port).
        #[arg(long)]
        connect: std::net::SocketAddr,
        #[command(flatten)]
        sock: SockArgs,
        /// Measured seconds.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Warm-up seconds left out of the measurement.
        #[arg(long, default_value_t = 2.0)]
        omit: f64,
        /// Offered load (SO_MAX_PACING_RATE), e.g. 900mbit.
        #[arg(long)]
        rate: Option<String>,
    },
    /// Bulk sink: accepts connections and discards their data.
    Sink {
        /// Address to listen on (ip:port).
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[command(flatten)]
        sock: SockArgs,
        /// Exit after this many connections have finished (default: serve forever).
        #[arg(long)]
        count: Option<usize>,
    },
}

/// Socket settings shared by `send` and `sink` (the `[tcp]` config keys as flags).
#[derive(Debug, clap::Args)]
pub struct SockArgs {
    /// Congestion control (cubic, bbr, reno, ipsan_sf, ipsan_sf_ss, ipsan_ss, ...).
    #[arg(long)]
    pub congestion: Option<String>,
    /// SO_SNDBUF request: bytes, 8MiB, auto or kernel.
    #[arg(long, default_value = "kernel")]
    pub sndbuf: ipsan_tcp::BufSize,
    /// SO_RCVBUF request: bytes, 8MiB, auto or kernel.
    #[arg(long, default_value = "kernel")]
    pub rcvbuf: ipsan_tcp::BufSize,
    /// TCP_WINDOW_CLAMP: pin the advertised receive window (bytes).
    #[arg(long)]
    pub window_clamp: Option<u32>,
    /// Link rate for `auto` buffers (e.g. 1gbit), with --link-rtt-ms.
    #[arg(long, requires = "link_rtt_ms")]
    pub link_rate: Option<String>,
    /// Link round-trip time in ms for `auto` buffers.
    #[arg(long, requires = "link_rate")]
    pub link_rtt_ms: Option<f64>,
}

impl SockArgs {
    fn settings(&self) -> anyhow::Result<ipsan_tcp::TcpSettings> {
        let link = match (&self.link_rate, self.link_rtt_ms) {
            (Some(rate), Some(ms)) if ms.is_finite() && ms > 0.0 => Some(ipsan_tcp::Link {
                bandwidth_bps: ipsan_tcp::bulk::parse_rate_bps(rate)?,
                rtt: std::time::Duration::from_secs_f64(ms / 1000.0),
            }),
            (Some(_), Some(ms)) => {
                anyhow::bail!("--link-rtt-ms must be a positive number, got {ms}")
            }
            _ => None,
        };
        let s = ipsan_tcp::TcpSettings {
            congestion: self.congestion.clone(),
            sndbuf: self.sndbuf,
            rcvbuf: self.rcvbuf,
            nodelay: None,
            window_clamp: self.window_clamp,
            link,
        };
        s.validate()?;
        Ok(s)
    }
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
            if let Some(n) = l.window_repairs {
                println!("repairs:   {n} corrupted windows repaired since load (docs/tcp.md)");
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
                window_clamp: None,
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
        TcpCommand::Send {
            connect,
            sock,
            seconds,
            omit,
            rate,
        } => {
            let opts = ipsan_tcp::bulk::SendOptions {
                settings: sock.settings()?,
                duration: secs("seconds", seconds)?,
                omit: secs("omit", omit)?,
                rate_bps: rate
                    .as_deref()
                    .map(ipsan_tcp::bulk::parse_rate_bps)
                    .transpose()?,
                connect_timeout: std::time::Duration::from_secs(5),
            };
            let result = ipsan_tcp::bulk::send(connect, &opts)?;
            println!("{}", ipsan_tcp::to_json_compact(&result)?);
            Ok(())
        }
        TcpCommand::Sink {
            listen,
            sock,
            count,
        } => {
            let settings = sock.settings()?;
            let (listener, in_force) = ipsan_tcp::bulk::listen(listen, &settings)?;
            tracing::info!(%listen, ?in_force, "sink listening");
            ipsan_tcp::bulk::sink(&listener, &settings, count)?;
            Ok(())
        }
    }
}

fn secs(what: &str, v: f64) -> anyhow::Result<std::time::Duration> {
    if !(v.is_finite() && (0.0..=86_400.0).contains(&v)) {
        anyhow::bail!("--{what} must be between 0 and 86400 seconds, got {v}");
    }
    Ok(std::time::Duration::from_secs_f64(v))
}

fn with_fallback_hint(e: ipsan_tcp::TcpError) -> anyhow::Error {
    let builtins = ipsan_tcp::available_congestion_controls()
        .map(|a| a.join(" "))
        .unwrap_or_else(|_| "reno cubic".into());
    anyhow::anyhow!("{e}\nthe built-in algorithms remain available: {builtins}; sockets asking for ipsan_sf* fall back to reno")
}
