//! Sequence numbers and the command window (RFC 7143 §4.2.2).
//!
//! CmdSN, StatSN, DataSN and R2TSN are 32-bit serial numbers compared with RFC 1982
//! arithmetic, so a long session wraps without confusing old and new.

/// `a < b` in 32-bit serial number arithmetic (RFC 1982 §3.2).
#[must_use]
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 0x8000_0000
}

/// `a <= b` in serial number arithmetic.
#[must_use]
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// The target's view of a session's command window (RFC 7143 §4.2.2.1).
///
/// Non-immediate commands must arrive with `ExpCmdSN <= CmdSN <= MaxCmdSN`; the target
/// executes them in CmdSN order and silently ignores those outside the window. The window
/// grants `depth` commands in flight: MaxCmdSN = ExpCmdSN + depth - 1 - (commands still
/// running), never moving backwards.
#[derive(Clone, Debug)]
pub struct CmdWindow {
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    depth: u32,
    in_flight: u32,
}

/// What to do with an arriving command's CmdSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// In order: run it (and ExpCmdSN has advanced for non-immediate commands).
    Execute,
    /// Outside the window: drop it silently (RFC 7143 §4.2.2.1).
    Ignore,
}

impl CmdWindow {
    /// A window starting at the CmdSN of the leading login, granting `depth` commands.
    #[must_use]
    pub fn new(initial_cmd_sn: u32, depth: u32) -> Self {
        let depth = depth.max(1);
        Self {
            exp_cmd_sn: initial_cmd_sn,
            max_cmd_sn: initial_cmd_sn.wrapping_add(depth - 1),
            depth,
            in_flight: 0,
        }
    }

    #[must_use]
    pub fn exp_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn
    }

    #[must_use]
    pub fn max_cmd_sn(&self) -> u32 {
        self.max_cmd_sn
    }

    /// Admits a command. Immediate commands (I bit) are not ordered and do not advance
    /// ExpCmdSN (RFC 7143 §3.2.2.1).
    ///
    /// With one connection per session (MaxConnections=1) commands arrive in CmdSN order, so
    /// a non-immediate CmdSN other than ExpCmdSN inside the window means the initiator skipped
    /// numbers; it is executed and the window moves past it, as TCP delivered it in order.
    pub fn admit(&mut self, cmd_sn: u32, immediate: bool) -> Admit {
        if immediate {
            return Admit::Execute;
        }
        if !(sn_le(self.exp_cmd_sn, cmd_sn) && sn_le(cmd_sn, self.max_cmd_sn)) {
            return Admit::Ignore;
        }
        self.exp_cmd_sn = cmd_sn.wrapping_add(1);
        self.in_flight += 1;
        Admit::Execute
    }

    /// A non-immediate command finished: its slot is free again.
    pub fn complete(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.refresh();
    }

    /// Recomputes MaxCmdSN (called when answering, so every response carries the current one).
    pub fn refresh(&mut self) {
        let free = self.depth.saturating_sub(self.in_flight);
        // MaxCmdSN = ExpCmdSN - 1 closes the window when nothing is free.
        let candidate = self.exp_cmd_sn.wrapping_add(free).wrapping_sub(1);
        if sn_lt(self.max_cmd_sn, candidate) {
            self.max_cmd_sn = candidate;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_compare_wraps() {
        assert!(sn_lt(1, 2));
        assert!(sn_lt(0xffff_fff0, 5));
        assert!(!sn_lt(5, 0xffff_fff0));
        assert!(sn_le(7, 7));
    }

    #[test]
    fn window_grants_depth_and_reopens_on_completion() {
        let mut w = CmdWindow::new(10, 4);
        assert_eq!((w.exp_cmd_sn(), w.max_cmd_sn()), (10, 13));
        for sn in 10..14 {
            assert_eq!(w.admit(sn, false), Admit::Execute);
        }
        assert_eq!(w.admit(14, false), Admit::Ignore, "beyond MaxCmdSN");
        w.refresh();
        assert_eq!(w.max_cmd_sn(), 13, "never shrinks, no slot freed");
        w.complete();
        assert_eq!(w.max_cmd_sn(), 14);
        assert_eq!(w.admit(14, false), Admit::Execute);
    }

    #[test]
    fn ignores_old_cmdsn_and_immediate_does_not_advance() {
        let mut w = CmdWindow::new(100, 8);
        assert_eq!(w.admit(100, false), Admit::Execute);
        assert_eq!(w.admit(100, false), Admit::Ignore, "duplicate CmdSN");
        assert_eq!(w.admit(99, false), Admit::Ignore);
        assert_eq!(w.admit(101, true), Admit::Execute);
        assert_eq!(w.exp_cmd_sn(), 101);
    }

    #[test]
    fn window_wraps_around_zero() {
        let mut w = CmdWindow::new(u32::MAX - 1, 4);
        for sn in [u32::MAX - 1, u32::MAX, 0, 1] {
            assert_eq!(w.admit(sn, false), Admit::Execute);
        }
        assert_eq!(w.exp_cmd_sn(), 2);
    }
}
