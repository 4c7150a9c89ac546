//! Append-only line logs.
//!
//! Worker logs are written unbuffered, one `write(2)` per line: a line is in the kernel as
//! soon as the event happened, so a SIGKILL loses nothing that was logged. The runner's logs
//! are buffered (it is never killed) and flushed at the end.
//!
//! Every line is `<kind> <time_us> <fields...>`, times in microseconds of `CLOCK_REALTIME`;
//! the formats are documented where the lines are written (`worker.rs`, `runner/mod.rs`,
//! `snapshot.rs`) and parsed in `checker/logs.rs` and `checker/snapshots.rs`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

enum Sink {
    Direct(File),
    Buffered(BufWriter<File>),
}

/// A line log shared by the tasks of one process.
pub struct Log {
    sink: Mutex<Sink>,
}

impl Log {
    /// A log whose every line is written at once (for processes that may be killed).
    pub fn direct(path: &Path) -> std::io::Result<Log> {
        let f = File::options().create(true).append(true).open(path)?;
        Ok(Log {
            sink: Mutex::new(Sink::Direct(f)),
        })
    }

    /// A buffered log (flushed by [`Log::flush`] and on drop).
    pub fn buffered(path: &Path) -> std::io::Result<Log> {
        let f = File::create(path)?;
        Ok(Log {
            sink: Mutex::new(Sink::Buffered(BufWriter::with_capacity(1 << 16, f))),
        })
    }

    /// Appends one line (a newline is added).
    pub fn line(&self, text: &str) {
        let mut buf = Vec::with_capacity(text.len() + 1);
        buf.extend_from_slice(text.as_bytes());
        buf.push(b'\n');
        let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        let _ = match &mut *sink {
            Sink::Direct(f) => f.write_all(&buf),
            Sink::Buffered(w) => w.write_all(&buf),
        };
    }

    /// Writes buffered lines out.
    pub fn flush(&self) {
        let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        if let Sink::Buffered(w) = &mut *sink {
            let _ = w.flush();
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.flush();
    }
}
