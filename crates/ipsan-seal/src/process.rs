//! Keeping a process that holds secrets (Seal PSKs, session keys, CHAP secrets) out of core
//! files: `ipsan target`, `gateway`, `attach` and `bench` with secrets call
//! [`forbid_core_dumps`] first thing.

/// Marks the process not dumpable and sets its core file size limit to 0: a crash (or a
/// `SIGQUIT`/`SIGABRT` from someone allowed to signal it) writes no core file holding keys,
/// and processes of the same user can no longer ptrace it or read its `/proc/PID/mem`
/// (`/proc/PID` becomes owned by root). `PR_SET_DUMPABLE` alone is not enough when
/// `fs.suid_dumpable` is 2 (such processes still dump, for root), hence `RLIMIT_CORE` too.
/// systemd units add `LimitCORE=0` (dist/).
pub fn forbid_core_dumps() -> std::io::Result<()> {
    set_not_dumpable()
}

#[allow(unsafe_code)]
fn set_not_dumpable() -> std::io::Result<()> {
    let zero = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `zero` is a valid `rlimit` on this stack frame for the whole call; setrlimit only
    // reads it.
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) takes plain integers and touches no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    #[allow(unsafe_code)]
    fn leaves_the_process_not_dumpable_with_no_core_limit() {
        super::forbid_core_dumps().unwrap();
        // SAFETY: PR_GET_DUMPABLE takes no pointer.
        let d = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
        assert_eq!(d, 0);
        let mut l = libc::rlimit {
            rlim_cur: 1,
            rlim_max: 1,
        };
        // SAFETY: `l` is a writable `rlimit` for the whole call.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_CORE, &mut l) }, 0);
        assert_eq!((l.rlim_cur, l.rlim_max), (0, 0));
    }
}
