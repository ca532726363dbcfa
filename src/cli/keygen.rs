//! `ipsan keygen [--out FILE]`: a fresh 256-bit random secret for Seal (or CHAP), as 64 hex
//! digits, the form `Psk::from_file` reads. With `--out` the file is created with O_EXCL and
//! mode 0600 (an existing file is never overwritten); without it the secret goes to stdout.
//! A machine secret needs no word-list resistance; a human-chosen one gets a warning where it
//! is loaded (docs/seal.md §3).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::Context;
use ipsan_seal::Psk;

/// Generate a random pre-shared secret.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write the secret to this new file (mode 0600; refuses to overwrite). Default: stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let secret = Psk::generate_hex()?;
    let Some(path) = args.out else {
        println!("{}", secret.as_str());
        return Ok(());
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| {
            format!(
                "cannot create {} (keygen never overwrites a file)",
                path.display()
            )
        })?;
    f.write_all(secret.as_bytes())
        .and_then(|()| f.write_all(b"\n"))
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!(
        "ipsan: wrote a 256-bit random secret to {} (mode 0600)",
        path.display()
    );
    Ok(())
}
