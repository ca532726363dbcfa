//! An opt-in per-command event trace: when each command was issued, sealed, sent, answered by
//! R2T, transferred, opened and completed — the data behind the lab's command timeline, drawn
//! like the papers' packet visualisations (Kamisaka et al. 2006 (004), Fig. 5–6) so the overlap
//! of pre-processing with the round trips is visible.
//!
//! A [`Trace`] is an observer of one session (`ipsan_initiator::Session::set_observer`, the
//! hook in `ipsan_initiator::observe`): zero cost when no observer is set, and when on, each
//! event is one short mutex-held push of 32 bytes. The event vocabulary is the initiator's
//! [`CommandEvent`]; its names in the file, the file itself and its reader live here.
//!
//! Times are nanoseconds since the trace was created (`Instant`, monotonic). "Sent" means
//! queued to the connection's writer task, which writes what is queued in its next batch.
//!
//! The JSON-lines file format (`ipsan-trace/1`) is documented in docs/bench.md.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ipsan_initiator::observe::CommandObserver;
use serde::{Deserialize, Serialize};

/// What happened to a command: the initiator's [`CommandEvent`] itself, serialized under its
/// snake_case name (`CommandEvent::name`), so the vocabulary is written once.
pub use ipsan_initiator::observe::CommandEvent as Kind;

/// One event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Nanoseconds since the trace started.
    pub t_ns: u64,
    /// The command's Initiator Task Tag.
    pub itt: u32,
    /// What happened.
    pub kind: Kind,
    /// Byte offset (R2T, Data-Out); 0 otherwise.
    pub offset: u64,
    /// Bytes concerned (immediate data, R2T, Data-Out); 0 otherwise.
    pub len: u64,
}

#[derive(Debug, Default)]
struct State {
    events: Vec<Event>,
    admitted: HashSet<u32>,
    commands: usize,
}

/// The trace sink. Share it in an `Arc` with `ipsan_initiator::Session::set_observer`.
#[derive(Debug)]
pub struct Trace {
    start: Instant,
    max_commands: usize,
    on: AtomicBool,
    state: Mutex<State>,
    refused: AtomicU64,
}

impl Trace {
    /// A trace starting now that records up to `max_commands` commands (later commands are
    /// counted as refused, never half-recorded).
    #[must_use]
    pub fn new(max_commands: usize) -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            max_commands,
            on: AtomicBool::new(true),
            state: Mutex::new(State::default()),
            refused: AtomicU64::new(0),
        })
    }

    /// Stop admitting new commands (commands already admitted keep recording until they
    /// complete).
    pub fn stop(&self) {
        self.on.store(false, Ordering::Relaxed);
    }

    /// Commands not recorded because the trace was full or stopped.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Record an event. `Issued` admits the command if there is room; other events are
    /// recorded only for admitted commands, so every command in the trace is whole.
    pub fn record(&self, itt: u32, kind: Kind, offset: u64, len: u64) {
        let t_ns = self.now();
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        if kind == Kind::Issued {
            if !self.on.load(Ordering::Relaxed) || st.commands >= self.max_commands {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // An ITT reused after wrapping starts a new command.
            st.admitted.insert(itt);
            st.commands += 1;
        } else if !st.admitted.contains(&itt) {
            return;
        }
        st.events.push(Event {
            t_ns,
            itt,
            kind,
            offset,
            len,
        });
        if matches!(kind, Kind::Completed | Kind::Failed) {
            st.admitted.remove(&itt);
        }
    }

    /// The events so far, in the order they were recorded (which is time order).
    pub fn events(&self) -> Vec<Event> {
        self.state
            .lock()
            .map(|s| s.events.clone())
            .unwrap_or_default()
    }

    /// Write the trace as JSON lines: `header` (an object; `schema` and `refused` are added)
    /// then one object per event, each with the command's index in issue order (`cmd`).
    pub fn write_jsonl<W: Write>(
        &self,
        mut w: W,
        mut header: serde_json::Map<String, serde_json::Value>,
    ) -> std::io::Result<()> {
        let events = self.events();
        header.insert("schema".into(), SCHEMA.into());
        header.insert("refused_commands".into(), self.refused().into());
        header.insert(
            "commands".into(),
            events
                .iter()
                .filter(|e| e.kind == Kind::Issued)
                .count()
                .into(),
        );
        serde_json::to_writer(&mut w, &serde_json::Value::Object(header))?;
        w.write_all(b"\n")?;
        let mut cmd_of: BTreeMap<u32, usize> = BTreeMap::new();
        let mut next = 0usize;
        for e in &events {
            if e.kind == Kind::Issued {
                cmd_of.insert(e.itt, next);
                next += 1;
            }
            let line = Line {
                t_us: e.t_ns as f64 / 1e3,
                cmd: cmd_of.get(&e.itt).copied().unwrap_or(usize::MAX),
                itt: e.itt,
                event: e.kind,
                offset: e.offset,
                len: e.len,
            };
            serde_json::to_writer(&mut w, &line)?;
            w.write_all(b"\n")?;
        }
        w.flush()
    }
}

impl CommandObserver for Trace {
    fn on_event(&self, itt: u32, event: Kind, offset: u64, len: u64) {
        self.record(itt, event, offset, len);
    }
}

/// The schema name on the header line.
pub const SCHEMA: &str = "ipsan-trace/1";

/// One event line of the file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Line {
    /// Microseconds since the trace started.
    pub t_us: f64,
    /// Index of the command in issue order (0, 1, ...).
    pub cmd: usize,
    /// Initiator Task Tag.
    pub itt: u32,
    /// What happened.
    pub event: Kind,
    /// Byte offset (R2T, Data-Out).
    pub offset: u64,
    /// Bytes concerned.
    pub len: u64,
}

/// A trace file read back: the header object and the events.
#[derive(Debug, Clone)]
pub struct TraceFile {
    /// The first line.
    pub header: serde_json::Map<String, serde_json::Value>,
    /// The event lines in file order.
    pub lines: Vec<Line>,
}

/// Parse an `ipsan-trace/1` JSON-lines text.
pub fn parse(text: &str) -> Result<TraceFile, String> {
    let mut it = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, first) = it.next().ok_or("empty trace")?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(first).map_err(|e| format!("trace line 1: {e}"))?;
    if header.get("schema").and_then(|s| s.as_str()) != Some(SCHEMA) {
        return Err(format!("trace line 1: schema is not {SCHEMA}"));
    }
    let mut lines = Vec::new();
    for (i, l) in it {
        lines.push(serde_json::from_str(l).map_err(|e| format!("trace line {}: {e}", i + 1))?);
    }
    Ok(TraceFile { header, lines })
}

/// One command's events, in time order.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandTrace {
    /// Index in issue order.
    pub cmd: usize,
    /// The ITT.
    pub itt: u32,
    /// (microseconds, event, offset, len).
    pub events: Vec<(f64, Kind, u64, u64)>,
}

impl CommandTrace {
    /// The first time of an event kind.
    pub fn at(&self, k: Kind) -> Option<f64> {
        self.events.iter().find(|e| e.1 == k).map(|e| e.0)
    }
    /// The last time of an event kind.
    pub fn last(&self, k: Kind) -> Option<f64> {
        self.events.iter().rev().find(|e| e.1 == k).map(|e| e.0)
    }
}

/// Group event lines per command, in issue order.
pub fn commands(lines: &[Line]) -> Vec<CommandTrace> {
    let mut by: BTreeMap<usize, CommandTrace> = BTreeMap::new();
    for l in lines {
        by.entry(l.cmd)
            .or_insert_with(|| CommandTrace {
                cmd: l.cmd,
                itt: l.itt,
                events: Vec::new(),
            })
            .events
            .push((l.t_us, l.event, l.offset, l.len));
    }
    by.into_values().collect()
}

/// Check that every command is whole and its events are in causal order: issued first,
/// seal before sending, sending before R2T/Data-In/status, open after status, and completed
/// (or failed) last; times never go backwards.
pub fn check(cmds: &[CommandTrace]) -> Result<(), String> {
    for c in cmds {
        let e = |why: &str| Err(format!("command {} (ITT {:#x}): {why}", c.cmd, c.itt));
        if c.events.first().map(|x| x.1) != Some(Kind::Issued) {
            return e("does not start with issued");
        }
        if !matches!(
            c.events.last().map(|x| x.1),
            Some(Kind::Completed | Kind::Failed)
        ) {
            return e("does not end with completed or failed");
        }
        if c.events.windows(2).any(|w| w[1].0 < w[0].0) {
            return e("time goes backwards");
        }
        let sent = c.at(Kind::CmdSent);
        let done = c.last(Kind::Completed).or(c.last(Kind::Failed));
        if c.at(Kind::Failed).is_none() {
            let Some(sent) = sent else {
                return e("completed without being sent");
            };
            let Some(status) = c.at(Kind::Status) else {
                return e("completed without a status");
            };
            if status < sent {
                return e("status before the command was sent");
            }
            if let (Some(s0), Some(s1)) = (c.at(Kind::SealStart), c.at(Kind::SealEnd)) {
                if !(s0 <= s1 && s1 <= sent) {
                    return e("sealed after sending");
                }
            }
            for (t, k, _, _) in &c.events {
                let after_send = matches!(
                    k,
                    Kind::R2t | Kind::DataInFirst | Kind::DataInLast | Kind::OpenStart
                );
                if after_send && *t < sent {
                    return e("answer before the command was sent");
                }
            }
            if let Some(o) = c.at(Kind::OpenStart) {
                if o < status {
                    return e("opened before the status");
                }
            }
        }
        let _ = done;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(t: &Trace) -> TraceFile {
        let mut buf = Vec::new();
        let mut h = serde_json::Map::new();
        h.insert("scheme".into(), "seal".into());
        t.write_jsonl(&mut buf, h).unwrap();
        parse(std::str::from_utf8(&buf).unwrap()).unwrap()
    }

    #[test]
    fn records_whole_commands_in_issue_order() {
        let t = Trace::new(10);
        for itt in [7u32, 8] {
            t.record(itt, Kind::Issued, 0, 0);
            t.record(itt, Kind::SealStart, 0, 0);
        }
        for itt in [7u32, 8] {
            t.record(itt, Kind::SealEnd, 0, 0);
            t.record(itt, Kind::CmdSent, 0, 0);
        }
        t.record(8, Kind::R2t, 0, 65536);
        t.record(8, Kind::DataOut, 0, 65536);
        t.record(8, Kind::Status, 0, 0);
        t.record(8, Kind::Completed, 0, 0);
        t.record(7, Kind::Status, 0, 0);
        t.record(7, Kind::Completed, 0, 0);
        let f = write(&t);
        assert_eq!(f.header["schema"], SCHEMA);
        assert_eq!(f.header["commands"], 2);
        assert_eq!(f.header["scheme"], "seal");
        let cmds = commands(&f.lines);
        assert_eq!(cmds.len(), 2);
        assert_eq!((cmds[0].cmd, cmds[0].itt), (0, 7));
        assert_eq!((cmds[1].cmd, cmds[1].itt), (1, 8));
        assert!(cmds[1].at(Kind::R2t).is_some());
        check(&cmds).unwrap();
        // Times are non-decreasing in file order.
        assert!(f.lines.windows(2).all(|w| w[0].t_us <= w[1].t_us));
    }

    #[test]
    fn refuses_commands_past_the_limit_without_fragments() {
        let t = Trace::new(1);
        t.record(1, Kind::Issued, 0, 0);
        t.record(2, Kind::Issued, 0, 0);
        t.record(2, Kind::CmdSent, 0, 0);
        t.record(2, Kind::Status, 0, 0);
        t.record(1, Kind::CmdSent, 0, 0);
        t.record(1, Kind::Status, 0, 0);
        t.record(1, Kind::Completed, 0, 0);
        t.stop();
        t.record(3, Kind::Issued, 0, 0);
        assert_eq!(t.refused(), 2);
        let ev = t.events();
        assert!(ev.iter().all(|e| e.itt == 1), "{ev:?}");
        check(&commands(&write(&t).lines)).unwrap();
    }

    #[test]
    fn check_rejects_incomplete_and_misordered_commands() {
        let l = |t: f64, k: Kind| Line {
            t_us: t,
            cmd: 0,
            itt: 1,
            event: k,
            offset: 0,
            len: 0,
        };
        let incomplete = [l(0.0, Kind::Issued), l(1.0, Kind::CmdSent)];
        assert!(check(&commands(&incomplete)).is_err());
        let sealed_late = [
            l(0.0, Kind::Issued),
            l(1.0, Kind::CmdSent),
            l(2.0, Kind::SealStart),
            l(3.0, Kind::SealEnd),
            l(4.0, Kind::Status),
            l(5.0, Kind::Completed),
        ];
        assert!(check(&commands(&sealed_late)).is_err());
        let no_status = [
            l(0.0, Kind::Issued),
            l(1.0, Kind::CmdSent),
            l(5.0, Kind::Completed),
        ];
        assert!(check(&commands(&no_status)).is_err());
        let ok = [
            l(0.0, Kind::Issued),
            l(1.0, Kind::CmdSent),
            l(3.0, Kind::DataInFirst),
            l(3.5, Kind::DataInLast),
            l(4.0, Kind::Status),
            l(4.5, Kind::OpenStart),
            l(4.8, Kind::OpenEnd),
            l(5.0, Kind::Completed),
        ];
        check(&commands(&ok)).unwrap();
        assert!(parse("{\"schema\":\"other\"}\n").is_err());
        assert!(parse("").is_err());
    }
}
