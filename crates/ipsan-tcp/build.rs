//! Builds the storage-friendly congestion controls (`bpf/ipsan_sf.bpf.c`) into a BPF object that
//! the crate embeds, so `ipsan tcp load` needs nothing from the source tree at run time.
//!
//! Needs clang (BPF target), libbpf's headers (`bpf/bpf_helpers.h`, Debian `libbpf-dev`) and
//! bpftool to generate `vmlinux.h` from the build machine's kernel BTF
//! (`/sys/kernel/btf/vmlinux`). `vmlinux.h` is generated into `OUT_DIR`, never committed (about
//! 3 MB). If any of these is missing the crate still builds: a cargo warning says why, and the
//! loader reports BPF as unavailable with the same reason. `IPSAN_TCP_NO_BPF=1` forces that path.

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCE: &str = "bpf/ipsan_sf.bpf.c";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ipsan_tcp_bpf)");
    println!("cargo::rerun-if-changed={SOURCE}");
    println!("cargo::rerun-if-changed=build.rs");
    for var in ["IPSAN_TCP_NO_BPF", "CLANG", "BPFTOOL"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    match build_object() {
        Ok(object) => {
            println!("cargo::rustc-cfg=ipsan_tcp_bpf");
            println!("cargo::rustc-env=IPSAN_TCP_BPF_OBJ={}", object.display());
        }
        Err(reason) => {
            println!("cargo::warning=ipsan-tcp: BPF congestion controls not built: {reason}");
            println!("cargo::rustc-env=IPSAN_TCP_BPF_MISSING={reason}");
        }
    }
}

fn build_object() -> Result<PathBuf, String> {
    if std::env::var_os("IPSAN_TCP_NO_BPF").is_some_and(|v| !v.is_empty() && v != "0") {
        return Err("IPSAN_TCP_NO_BPF is set".into());
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    let arch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86",
        Ok("aarch64") => "arm64",
        Ok("riscv64") => "riscv",
        Ok("s390x") => "s390",
        Ok("powerpc64") => "powerpc",
        Ok(other) => return Err(format!("no BPF target mapping for arch {other}")),
        Err(_) => return Err("CARGO_CFG_TARGET_ARCH is not set".into()),
    };
    let clang = find_tool(
        "CLANG",
        &["clang", "clang-19", "clang-16", "clang-15", "clang-14"],
    )
    .ok_or("clang not found (Debian: apt-get install clang)")?;
    let bpftool = find_tool("BPFTOOL", &["bpftool", "/usr/sbin/bpftool"])
        .ok_or("bpftool not found (Debian: apt-get install bpftool)")?;
    let include = ["/usr/include", "/usr/local/include"]
        .iter()
        .map(Path::new)
        .find(|dir| dir.join("bpf/bpf_helpers.h").exists())
        .ok_or("libbpf headers not found (Debian: apt-get install libbpf-dev)")?;
    let btf = Path::new("/sys/kernel/btf/vmlinux");
    if !btf.exists() {
        return Err("kernel BTF /sys/kernel/btf/vmlinux not present".into());
    }

    let vmlinux_h = out.join("vmlinux.h");
    let dump = Command::new(&bpftool)
        .args(["btf", "dump", "file"])
        .arg(btf)
        .args(["format", "c"])
        .output()
        .map_err(|e| format!("running {bpftool}: {e}"))?;
    if !dump.status.success() {
        return Err(format!(
            "bpftool btf dump failed: {}",
            String::from_utf8_lossy(&dump.stderr).trim()
        ));
    }
    std::fs::write(&vmlinux_h, &dump.stdout).map_err(|e| format!("writing vmlinux.h: {e}"))?;

    let object = out.join("ipsan_sf.bpf.o");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").ok_or("no manifest dir")?);
    let status = Command::new(&clang)
        .args(["-g", "-O2", "-Wall", "-target", "bpf"])
        .arg(format!("-D__TARGET_ARCH_{arch}"))
        .arg("-I")
        .arg(&out)
        .arg("-I")
        .arg(include)
        .arg("-c")
        .arg(manifest.join(SOURCE))
        .arg("-o")
        .arg(&object)
        .status()
        .map_err(|e| format!("running {clang}: {e}"))?;
    if !status.success() {
        return Err(format!("{clang} failed to compile {SOURCE} ({status})"));
    }
    // DWARF is not needed at load time (BTF is kept); strip it when llvm-strip is around.
    if let Some(strip) = find_tool(
        "LLVM_STRIP",
        &["llvm-strip", "llvm-strip-14", "llvm-strip-16"],
    ) {
        let _ = Command::new(strip).arg("-g").arg(&object).status();
    }
    Ok(object)
}

/// The tool named by `env`, else the first of `names` that runs `--version`.
fn find_tool(env: &str, names: &[&str]) -> Option<String> {
    let from_env = std::env::var(env).ok().filter(|s| !s.is_empty());
    from_env
        .into_iter()
        .chain(names.iter().map(|s| s.to_string()))
        .find(|tool| {
            Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}
