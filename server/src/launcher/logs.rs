//! Run logs: the process writes `<run dir>/output.log` directly (so its output never depends on
//! the server being up); the server reads it by offset or tail and, while a run is supervised,
//! polls it for new bytes and fans them out to followers.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// Longest slice one offset read returns.
pub const MAX_READ_BYTES: u64 = 1 << 20;

/// New log bytes (whole lines, except for the final flush) starting at `offset`.
#[derive(Debug, Clone, PartialEq)]
pub enum LogEvent {
    Chunk {
        offset: u64,
        text: String,
    },
    /// The run's process ended; no more output will come from this attempt.
    End,
}

/// A slice of a log file.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct LogSlice {
    /// Byte offset of `text` in the file.
    pub offset: u64,
    /// Offset to pass back to continue reading.
    pub next_offset: u64,
    /// Current size of the file.
    pub size: u64,
    pub text: String,
}

/// Reads from `offset` to the end (at most `MAX_READ_BYTES`). A missing file reads as empty.
pub fn read_from(path: &Path, offset: u64) -> std::io::Result<LogSlice> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(LogSlice {
                offset: 0,
                next_offset: 0,
                size: 0,
                text: String::new(),
            })
        }
        Err(e) => return Err(e),
    };
    let size = file.metadata()?.len();
    let start = offset.min(size);
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    file.take(MAX_READ_BYTES).read_to_end(&mut buf)?;
    Ok(LogSlice {
        offset: start,
        next_offset: start + buf.len() as u64,
        size,
        text: String::from_utf8_lossy(&buf).into_owned(),
    })
}

/// The last `lines` lines (scans back at most `MAX_READ_BYTES`).
pub fn read_tail(path: &Path, lines: usize) -> std::io::Result<LogSlice> {
    let size = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e),
    };
    let window_start = size.saturating_sub(MAX_READ_BYTES);
    let slice = read_from(path, window_start)?;
    let text = slice.text.as_str();
    let body = text.strip_suffix('\n').unwrap_or(text);
    let mut cut = body.len();
    let mut seen = 0;
    if lines == 0 {
        cut = text.len();
    } else {
        for (i, b) in body.bytes().enumerate().rev() {
            if b == b'\n' {
                seen += 1;
                if seen == lines {
                    cut = i + 1;
                    break;
                }
            }
        }
        if seen < lines {
            cut = 0;
        }
    }
    Ok(LogSlice {
        offset: slice.offset + cut as u64,
        next_offset: slice.next_offset,
        size: slice.size,
        text: text[cut..].to_string(),
    })
}

/// Broadcast channels of supervised runs' logs. A run has a channel only while someone follows
/// it: following creates it, the last follower leaving removes it, and publishing to a run
/// nobody follows costs one map lookup. So no request, however many and for whatever id, leaves
/// anything behind.
#[derive(Default)]
pub struct LogHub {
    channels: Arc<Mutex<HashMap<String, broadcast::Sender<LogEvent>>>>,
}

type Channels = Arc<Mutex<HashMap<String, broadcast::Sender<LogEvent>>>>;

fn lock(
    channels: &Channels,
) -> std::sync::MutexGuard<'_, HashMap<String, broadcast::Sender<LogEvent>>> {
    // Every operation is one insert, lookup or remove: the map is consistent even after a panic.
    channels.lock().unwrap_or_else(|p| p.into_inner())
}

impl LogHub {
    /// Follows a run's new output. Check that the run exists first: the channel lives as long
    /// as the returned follower.
    pub fn subscribe(&self, run_id: &str) -> LogFollower {
        let receiver = lock(&self.channels)
            .entry(run_id.to_string())
            .or_insert_with(|| broadcast::channel(1024).0)
            .subscribe();
        LogFollower {
            channels: Arc::clone(&self.channels),
            run_id: run_id.to_string(),
            receiver: Some(receiver),
        }
    }

    /// Sends to the run's followers, if it has any.
    pub fn publish(&self, run_id: &str, event: LogEvent) {
        let mut map = lock(&self.channels);
        if let Some(sender) = map.get(run_id) {
            if sender.send(event).is_err() {
                map.remove(run_id);
            }
        }
    }

    /// Forgets a run's channel once its process has ended: followers still receive what was
    /// sent, then see the channel closed.
    pub fn close(&self, run_id: &str) {
        lock(&self.channels).remove(run_id);
    }

    /// Runs with a live channel (for tests and diagnostics).
    pub fn channel_count(&self) -> usize {
        lock(&self.channels).len()
    }
}

/// One follower of a run's log; dropping the last one removes the run's channel.
pub struct LogFollower {
    channels: Channels,
    run_id: String,
    receiver: Option<broadcast::Receiver<LogEvent>>,
}

impl LogFollower {
    pub async fn recv(&mut self) -> Result<LogEvent, broadcast::error::RecvError> {
        match self.receiver.as_mut() {
            Some(receiver) => receiver.recv().await,
            None => Err(broadcast::error::RecvError::Closed),
        }
    }
}

impl Drop for LogFollower {
    fn drop(&mut self) {
        drop(self.receiver.take());
        let mut map = lock(&self.channels);
        if map
            .get(&self.run_id)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            map.remove(&self.run_id);
        }
    }
}

/// Follows one log file: each `poll` publishes the bytes appended since the last one, up to the
/// last complete line (`flush` publishes a trailing partial line too).
pub struct Tailer {
    offset: u64,
}

impl Tailer {
    /// Starts at the current end: earlier content is served by `read_from`.
    pub fn at_end(path: &Path) -> Tailer {
        Tailer {
            offset: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        }
    }

    pub fn poll(&mut self, path: &Path, whole_lines_only: bool) -> Option<LogEvent> {
        let size = std::fs::metadata(path).ok()?.len();
        if size <= self.offset {
            return None;
        }
        let slice = read_from(path, self.offset).ok()?;
        let text = if whole_lines_only {
            let end = slice.text.rfind('\n')? + 1;
            slice.text[..end].to_string()
        } else {
            slice.text
        };
        if text.is_empty() {
            return None;
        }
        let offset = self.offset;
        self.offset += text.len() as u64;
        Some(LogEvent::Chunk { offset, text })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn tail_returns_the_last_lines_and_their_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "one\ntwo\nthree\nfour\n").unwrap();
        let tail = read_tail(&path, 2).unwrap();
        assert_eq!(tail.text, "three\nfour\n");
        assert_eq!(tail.offset, 8);
        assert_eq!(
            read_tail(&path, 10).unwrap().text,
            "one\ntwo\nthree\nfour\n"
        );
        let from = read_from(&path, 4).unwrap();
        assert_eq!(from.text, "two\nthree\nfour\n");
        assert_eq!(from.next_offset, 19);
    }

    #[test]
    fn a_missing_log_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_tail(&dir.path().join("none"), 5).unwrap().text, "");
    }

    #[test]
    fn the_tailer_publishes_whole_lines_and_keeps_partial_ones_for_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "old\n").unwrap();
        let mut t = Tailer::at_end(&path);
        assert_eq!(t.poll(&path, true), None);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        write!(f, "a\nb").unwrap();
        assert_eq!(
            t.poll(&path, true),
            Some(LogEvent::Chunk {
                offset: 4,
                text: "a\n".into()
            })
        );
        assert_eq!(t.poll(&path, true), None);
        assert_eq!(
            t.poll(&path, false),
            Some(LogEvent::Chunk {
                offset: 6,
                text: "b".into()
            })
        );
    }

    #[tokio::test]
    async fn a_run_has_a_log_channel_only_while_someone_follows_it() {
        let hub = LogHub::default();
        hub.publish("r1", LogEvent::End);
        assert_eq!(hub.channel_count(), 0, "publishing creates nothing");
        let a = hub.subscribe("r1");
        let mut b = hub.subscribe("r1");
        assert_eq!(hub.channel_count(), 1);
        hub.publish("r1", LogEvent::End);
        assert_eq!(b.recv().await.ok(), Some(LogEvent::End));
        drop(a);
        assert_eq!(hub.channel_count(), 1, "one follower is left");
        drop(b);
        assert_eq!(hub.channel_count(), 0);
    }

    #[tokio::test]
    async fn a_closed_channel_ends_its_followers_and_a_new_one_can_be_opened() {
        let hub = LogHub::default();
        let mut old = hub.subscribe("r1");
        hub.close("r1");
        assert!(old.recv().await.is_err());
        let _new = hub.subscribe("r1");
        drop(old);
        assert_eq!(
            hub.channel_count(),
            1,
            "the old follower leaves the new channel alone"
        );
    }
}
