//! The transcript: a JSONL write-ahead log of the run, one record per line, each written and
//! fsynced before the loop moves on. A `tool_use` record is on disk before its tool runs and
//! its `tool_result` after, so after a crash the log tells which calls may have had effects.
//!
//! Loading tolerates exactly what a crash can leave: a torn last line (the process died in the
//! middle of writing it), which is dropped and overwritten on the next append.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::hooks::Decision;
use super::wire::Usage;

/// One line of the transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Record {
    /// The start of a run.
    Task {
        task: String,
        model: String,
        workspace: String,
        /// Seconds since the Unix epoch.
        started_at: u64,
    },
    /// A later run continuing this transcript with `--resume`.
    Resume {
        model: String,
        workspace: String,
        started_at: u64,
    },
    /// User content sent to the model (the task, or a follow-up given with `--resume`).
    User { content: Vec<Value> },
    /// A finished reply.
    Assistant {
        content: Vec<Value>,
        stop_reason: String,
        usage: Usage,
    },
    /// A tool call and the hook chain's decision, written before the tool runs.
    ToolUse {
        id: String,
        name: String,
        input: Value,
        decision: Decision,
        /// Set when a resumed run reruns a read-only call that had no result.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        rerun: bool,
    },
    /// A tool call's result, exactly as sent to the model.
    ToolResult {
        tool_use_id: String,
        content: String,
        is_error: bool,
    },
}

/// A transcript that cannot be read back.
#[derive(Debug)]
pub(super) enum TranscriptError {
    Io {
        path: PathBuf,
        source: io::Error,
    },
    BadLine {
        path: PathBuf,
        line: usize,
        detail: String,
    },
}

impl fmt::Display for TranscriptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TranscriptError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            TranscriptError::BadLine { path, line, detail } => {
                write!(
                    f,
                    "{}:{line}: not a transcript record: {detail}",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for TranscriptError {}

/// A transcript read back: its records and how many bytes of the file they span.
#[derive(Debug)]
pub(super) struct Loaded {
    pub records: Vec<Record>,
    /// Bytes up to the end of the last whole record; a torn line after it is cut off.
    pub valid_len: u64,
    /// The file, locked ([`hold`]) before it was read: the run resuming it is its only writer.
    file: Option<File>,
}

/// Reads a transcript for `--resume`, locked first: a run still writing it (killed by its
/// caller but not dead, or started in another terminal) would interleave its records with
/// this run's, each answering the same calls, and the resume would cut its last line off.
pub(super) fn load(path: &Path) -> Result<Loaded, TranscriptError> {
    let io = |source| TranscriptError::Io {
        path: path.to_owned(),
        source,
    };
    // Read-only: a finished run's transcript can be looked at (and its outcome told) without
    // write access; the lock is the same on a descriptor opened for reading.
    let mut file = File::open(path).map_err(io)?;
    hold(&file).map_err(io)?;
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut file, &mut bytes).map_err(io)?;
    let mut loaded = parse(&bytes).map_err(|(line, detail)| TranscriptError::BadLine {
        path: path.to_owned(),
        line,
        detail,
    })?;
    loaded.file = Some(file);
    Ok(loaded)
}

/// Takes the transcript's lock (`flock`, exclusive, not waiting), held while the file is
/// open: another run holding it is an error, never a wait.
fn hold(file: &File) -> io::Result<()> {
    file.try_lock().map_err(|e| match e {
        std::fs::TryLockError::WouldBlock => io::Error::new(
            io::ErrorKind::WouldBlock,
            "another run of legate agent is writing it (it holds the file's lock)",
        ),
        std::fs::TryLockError::Error(e) => e,
    })
}

/// Parses transcript bytes; the error is (1-based line, detail).
fn parse(bytes: &[u8]) -> Result<Loaded, (usize, String)> {
    let mut records = Vec::new();
    let mut valid_len = 0u64;
    let mut rest = bytes;
    let mut line_no = 0;
    while !rest.is_empty() {
        line_no += 1;
        let (line, complete, used) = match rest.iter().position(|&b| b == b'\n') {
            Some(end) => (&rest[..end], true, end + 1),
            None => (rest, false, rest.len()),
        };
        rest = &rest[used..];
        if line.iter().all(u8::is_ascii_whitespace) {
            if complete {
                valid_len += used as u64;
            }
            continue;
        }
        match serde_json::from_slice::<Record>(line) {
            Ok(record) => {
                records.push(record);
                valid_len += used as u64;
            }
            // The last line without its newline was being written when the process died.
            Err(_) if !complete => break,
            Err(e) => return Err((line_no, e.to_string())),
        }
    }
    Ok(Loaded {
        records,
        valid_len,
        file: None,
    })
}

/// Appends records, fsyncing each; a no-op without a file.
#[derive(Debug)]
pub(super) struct Writer {
    file: Option<File>,
    /// The resumed transcript's lock ([`load`]'s file), held while this writer lives.
    _lock: Option<File>,
    /// A newline is owed before the next record (the file ended in a whole record that lacked
    /// its newline).
    owes_newline: bool,
}

impl Writer {
    /// No transcript.
    pub(super) fn none() -> Writer {
        Writer {
            file: None,
            _lock: None,
            owes_newline: false,
        }
    }

    /// A new transcript. An existing non-empty file is refused: it belongs to another run,
    /// and `--resume` is the way to continue it.
    pub(super) fn create(path: &Path) -> io::Result<Writer> {
        let exists = || {
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists; continue it with --resume or choose another file",
                    path.display()
                ),
            )
        };
        if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
            return Err(exists());
        }
        // O_APPEND: every record lands at the end of the file as it is then, so a file cut
        // short from outside gets whole records after the cut, never a run of NUL bytes up to
        // the writer's old offset.
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        // Locked, then looked at again: of two runs started on the same new file, the second
        // finds it locked, or holding the first one's records.
        hold(&file)?;
        if file.metadata()?.len() > 0 {
            return Err(exists());
        }
        Ok(Writer {
            file: Some(file),
            _lock: None,
            owes_newline: false,
        })
    }

    /// Continues a loaded transcript, cutting off a torn last line first.
    pub(super) fn resume(path: &Path, loaded: &Loaded) -> io::Result<Writer> {
        // The lock `load` took is shared by a copy of its descriptor, kept here: held while
        // either is open.
        let lock = loaded.file.as_ref().map(File::try_clone).transpose()?;
        let file = OpenOptions::new().append(true).open(path)?;
        file.set_len(loaded.valid_len)?;
        file.sync_data()?;
        let owes_newline = loaded.valid_len > 0 && !ends_with_newline(path, loaded.valid_len)?;
        Ok(Writer {
            file: Some(file),
            _lock: lock,
            owes_newline,
        })
    }

    /// Writes one record and its newline, then fsyncs, so the record survives a crash that
    /// happens right after this returns.
    pub(super) fn write(&mut self, record: &Record) -> io::Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        let mut line = Vec::with_capacity(256);
        if self.owes_newline {
            line.push(b'\n');
        }
        // A key the model wrote (in a call the secret scan refused, or its text), or the
        // task held, is not kept on disk either.
        let mut value = serde_json::to_value(record).map_err(io::Error::other)?;
        redact_strings(&mut value);
        serde_json::to_writer(&mut line, &value).map_err(io::Error::other)?;
        line.push(b'\n');
        file.write_all(&line)?;
        file.sync_data()?;
        self.owes_newline = false;
        Ok(())
    }
}

/// Every string in `value` with its keys withheld (`secrets::redact`). A thinking block whose
/// text holds one is left out instead: its signature covers the text as the model wrote it,
/// and the altered pair, sent again on a resume, would be refused by the provider.
fn redact_strings(value: &mut Value) {
    match value {
        Value::String(s) => {
            if let std::borrow::Cow::Owned(redacted) = super::secrets::redact(s) {
                *s = redacted;
            }
        }
        Value::Array(items) => {
            items.retain(|item| !signed_with_a_key(item));
            items.iter_mut().for_each(redact_strings);
        }
        Value::Object(members) => members.values_mut().for_each(redact_strings),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// A thinking block whose text redaction would change.
fn signed_with_a_key(item: &Value) -> bool {
    item["type"] == "thinking"
        && item["thinking"]
            .as_str()
            .is_some_and(|t| matches!(super::secrets::redact(t), std::borrow::Cow::Owned(_)))
}

fn ends_with_newline(path: &Path, len: u64) -> io::Result<bool> {
    use std::io::{Read, Seek};
    let mut file = File::open(path)?;
    file.seek(io::SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    Ok(last[0] == b'\n')
}

/// Seconds since the Unix epoch, for the run records.
pub(super) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::hooks::Hook;
    use serde_json::json;

    fn sample() -> Vec<Record> {
        vec![
            Record::Task {
                task: "t".to_owned(),
                model: "m".to_owned(),
                workspace: "/w".to_owned(),
                started_at: 1,
            },
            Record::User {
                content: vec![json!({"type": "text", "text": "t"})],
            },
            Record::ToolUse {
                id: "a".to_owned(),
                name: "read_file".to_owned(),
                input: json!({"path": "x"}),
                decision: Decision {
                    allow: true,
                    hook: Hook::Approval,
                    reason: "read-only tool".to_owned(),
                },
                rerun: false,
            },
            Record::ToolResult {
                tool_use_id: "a".to_owned(),
                content: "x".to_owned(),
                is_error: false,
            },
        ]
    }

    #[test]
    fn records_have_the_documented_shape() -> Result<(), serde_json::Error> {
        let line = serde_json::to_value(&sample()[2])?;
        assert_eq!(
            line,
            json!({"type": "tool_use", "id": "a", "name": "read_file", "input": {"path": "x"},
                   "decision": {"allow": true, "hook": "approval", "reason": "read-only tool"}})
        );
        let result = serde_json::to_value(&sample()[3])?;
        assert_eq!(
            result,
            json!({"type": "tool_result", "tool_use_id": "a", "content": "x", "is_error": false})
        );
        Ok(())
    }

    #[test]
    fn written_records_load_back() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("t.jsonl");
        let mut writer = Writer::create(&path)?;
        for r in sample() {
            writer.write(&r)?;
        }
        drop(writer);
        let loaded = load(&path)?;
        assert_eq!(loaded.records, sample());
        assert_eq!(loaded.valid_len, std::fs::metadata(&path)?.len());
        assert!(
            Writer::create(&path).is_err(),
            "an existing transcript is not clobbered"
        );
        Ok(())
    }

    /// A thinking block that quotes a key is left out of its record whole (its signature would
    /// no longer match an altered text); one without a key keeps its text and signature.
    #[test]
    fn a_signed_thinking_block_holding_a_key_is_left_out_not_altered()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("t.jsonl");
        let mut writer = Writer::create(&path)?;
        let keyed = json!({"type": "thinking", "thinking": "the key AKIAIOSFODNN7EXAMPLE", "signature": "sig"});
        let plain = json!({"type": "thinking", "thinking": "hmm", "signature": "sig2"});
        let text = json!({"type": "text", "text": "done"});
        writer.write(&Record::Assistant {
            content: vec![keyed, plain.clone(), text.clone()],
            stop_reason: "end_turn".to_owned(),
            usage: Usage::default(),
        })?;
        drop(writer);
        let kept = std::fs::read_to_string(&path)?;
        assert!(
            !kept.contains("AKIA") && !kept.contains("\"sig\""),
            "{kept}"
        );
        match &load(&path)?.records[..] {
            [Record::Assistant { content, .. }] => assert_eq!(content, &vec![plain, text]),
            other => panic!("{other:?}"),
        }
        Ok(())
    }

    /// A transcript one run writes cannot be resumed, or started, by another until it ends.
    #[test]
    fn a_transcript_in_use_is_refused_to_a_second_run() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("t.jsonl");
        let mut first = Writer::create(&path)?;
        let busy = |e: &TranscriptError| matches!(e, TranscriptError::Io { source, .. } if source.kind() == io::ErrorKind::WouldBlock);
        assert!(load(&path).is_err_and(|e| busy(&e)));
        first.write(&sample()[0])?;
        let empty = dir.path().join("new.jsonl");
        let racing = Writer::create(&empty)?;
        assert_eq!(
            Writer::create(&empty).err().map(|e| e.kind()),
            Some(io::ErrorKind::WouldBlock),
            "two runs started on one new file"
        );
        drop((first, racing));
        let loaded = load(&path)?;
        assert!(
            load(&path).is_err_and(|e| busy(&e)),
            "the resuming run holds it"
        );
        let mut resumed = Writer::resume(&path, &loaded)?;
        drop(loaded);
        assert!(load(&path).is_err_and(|e| busy(&e)), "so does its writer");
        resumed.write(&sample()[1])?;
        drop(resumed);
        assert_eq!(load(&path)?.records, sample()[..2].to_vec());
        Ok(())
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_overwritten() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("t.jsonl");
        let mut text = String::new();
        for r in &sample()[..2] {
            text.push_str(&serde_json::to_string(r)?);
            text.push('\n');
        }
        let whole = text.len() as u64;
        text.push_str(r#"{"type":"tool_use","id":"#);
        std::fs::write(&path, &text)?;
        let loaded = load(&path)?;
        assert_eq!(loaded.records, sample()[..2].to_vec());
        assert_eq!(loaded.valid_len, whole);
        let mut writer = Writer::resume(&path, &loaded)?;
        writer.write(&sample()[3])?;
        drop((writer, loaded));
        assert_eq!(load(&path)?.records.len(), 3);
        Ok(())
    }

    #[test]
    fn a_whole_last_record_without_newline_is_kept() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("t.jsonl");
        std::fs::write(&path, serde_json::to_string(&sample()[0])?)?;
        let loaded = load(&path)?;
        assert_eq!(loaded.records.len(), 1);
        let mut writer = Writer::resume(&path, &loaded)?;
        writer.write(&sample()[1])?;
        drop((writer, loaded));
        assert_eq!(load(&path)?.records, sample()[..2].to_vec());
        Ok(())
    }

    #[test]
    fn a_file_cut_short_from_outside_gets_whole_records_and_no_hole()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("t.jsonl");
        let mut writer = Writer::create(&path)?;
        writer.write(&sample()[0])?;
        writer.write(&sample()[1])?;
        OpenOptions::new().write(true).open(&path)?.set_len(0)?;
        writer.write(&sample()[2])?;
        drop(writer);
        let bytes = std::fs::read(&path)?;
        assert!(!bytes.contains(&0), "a hole of NUL bytes");
        assert_eq!(load(&path)?.records, sample()[2..3].to_vec());
        // The same for a resumed transcript.
        let mut writer = Writer::resume(&path, &load(&path)?)?;
        OpenOptions::new().write(true).open(&path)?.set_len(0)?;
        writer.write(&sample()[3])?;
        drop(writer);
        assert_eq!(load(&path)?.records, sample()[3..].to_vec());
        Ok(())
    }

    #[test]
    fn a_bad_line_in_the_middle_is_an_error_with_its_number() {
        let text = format!(
            "{}\nnot json\n{}\n",
            serde_json::to_string(&sample()[0]).unwrap_or_default(),
            serde_json::to_string(&sample()[1]).unwrap_or_default()
        );
        assert!(matches!(parse(text.as_bytes()), Err((2, _))));
    }

    #[test]
    fn no_file_means_no_writes() -> io::Result<()> {
        Writer::none().write(&sample()[0])
    }
}
