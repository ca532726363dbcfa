//! The client side (`ipsan ctl`): one request over the socket, one answer.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

/// Sends one request to the control socket at `path` and returns its `result`, or the error
/// the target answered with (message, field).
pub fn request(path: &Path, method: &str, params: Value) -> Result<Value, ClientError> {
    // A busy target's backlog may be full for a moment: retry a refused connect briefly.
    let mut tries = 0u32;
    let mut s = loop {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(s) => break s,
            Err(e)
                if tries < 10
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::WouldBlock
                    )
                    && path.exists() =>
            {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10 << tries.min(5)));
            }
            Err(e) => {
                return Err(ClientError::Connect {
                    path: path.to_owned(),
                    source: e,
                })
            }
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(ClientError::Io)?;
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let mut line = serde_json::to_vec(&req).map_err(|e| ClientError::Protocol(e.to_string()))?;
    line.push(b'\n');
    s.write_all(&line).map_err(ClientError::Io)?;
    let mut answer = String::new();
    BufReader::new(&s)
        .read_line(&mut answer)
        .map_err(ClientError::Io)?;
    let v: Value = serde_json::from_str(&answer)
        .map_err(|e| ClientError::Protocol(format!("answer is not JSON ({e}): {answer:?}")))?;
    if let Some(e) = v.get("error") {
        return Err(ClientError::Remote {
            code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("error")
                .to_owned(),
        });
    }
    Ok(v.get("result").cloned().unwrap_or(Value::Null))
}

/// Errors of [`request`].
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the control socket {path}: {source}. Is `ipsan target --control {path}` running, and are you root or its user? `ipsan ctl` uses --control PATH, else $IPSAN_CONTROL, else /run/ipsan/control.sock")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("control socket: {0}")]
    Io(std::io::Error),
    #[error("control socket: {0}")]
    Protocol(String),
    #[error("{message}")]
    Remote { code: i64, message: String },
}
