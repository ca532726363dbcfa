//! The processes a run starts: children killed on drop, started with their output watched,
//! run with a time bound, and their CPU time read from `/proc`.

use super::*;

/// Children killed on drop (and files they leave behind removed), so a failing run cleans up.
pub(in crate::runner) struct Procs(
    pub(in crate::runner) Vec<(String, Child)>,
    pub(in crate::runner) Vec<PathBuf>,
);

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
        for f in &self.1 {
            let _ = std::fs::remove_file(f);
            crate::guard::unregister_file(f);
        }
    }
}

pub(in crate::runner) fn side_name(side: Side) -> &'static str {
    match side {
        Side::Ini => "ini",
        Side::Tgt => "tgt",
    }
}

pub(in crate::runner) fn wait_connect(link: &LabLink, addr: SocketAddr) -> Result<(), String> {
    let t = Instant::now();
    loop {
        let r = link
            .link
            .run_in(Side::Ini, move || {
                TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map(|_| ())
            })
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        match r {
            Ok(()) => return Ok(()),
            Err(e) if t.elapsed() > Duration::from_secs(8) => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

pub(in crate::runner) fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(in crate::runner) fn run_quiet(c: &mut Command) -> Result<String, String> {
    let o = c.output().map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

pub(in crate::runner) fn spawn_watch(
    mut c: Command,
) -> std::io::Result<(Child, mpsc::Receiver<String>)> {
    crate::guard::guard_child(&mut c);
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    let mut child = c.spawn()?;
    let (tx, rx) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
    }
    if let Some(err) = child.stderr.take() {
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
    }
    Ok((child, rx))
}

pub(in crate::runner) fn wait_line(
    rx: &mpsc::Receiver<String>,
    needle: &str,
    limit: Duration,
) -> Result<(), String> {
    let t = Instant::now();
    let mut last = String::new();
    while t.elapsed() < limit {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(l) if l.contains(needle) => return Ok(()),
            Ok(l) => last = l,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(format!("exited; last output: {last}"))
            }
        }
    }
    Err(format!(
        "no {needle:?} within {limit:?}; last output: {last}"
    ))
}

/// Runs `c` to completion, killing it after `limit`.
pub(in crate::runner) fn run_bounded(
    mut c: Command,
    limit: Duration,
) -> Result<std::process::Output, String> {
    crate::guard::guard_child(&mut c);
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    let mut child = c.spawn().map_err(|e| e.to_string())?;
    let t = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().map_err(|e| e.to_string()),
            Ok(None) if t.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("killed after {limit:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// User + system CPU seconds of a process (all its threads), from /proc/PID/stat.
pub fn proc_cpu_s(pid: u32) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // The command name may hold spaces; fields resume after the last ')'.
    let Some(rest) = s.rsplit_once(')').map(|(_, r)| r) else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3, utime field 14, stime field 15 → indices 11 and 12.
    let ticks = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (ticks(11) + ticks(12)) / clk_tck()
}

pub(in crate::runner) fn clk_tck() -> f64 {
    static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Whether `exe <sub> --help` mentions `flag`.
pub fn help_mentions(exe: &Path, sub: &str, flag: &str) -> bool {
    Command::new(exe)
        .args([sub, "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
        .unwrap_or(false)
}
