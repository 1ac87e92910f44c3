//! The files legate reads beside its config — provider key files, AWS credentials files,
//! service-account token and key files, TLS material — read as a regular file of bounded size.
//! A FIFO at such a path held the thread that read it for ever: a reload that never ended (and
//! kept the signal loop from seeing SIGTERM), a key watcher that never woke again, a process
//! that could not exit. A huge file was read whole, four times a second for a watched key.
//!
//! The file is opened without blocking (`O_NONBLOCK`: a FIFO opens at once instead of waiting
//! for a writer) and refused unless the opened file is a regular one; the size is checked on
//! what is read, never on what `stat` said, since the file may grow meanwhile.

use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// A key or token file: a key is a few hundred bytes at most.
pub(crate) const SMALL: u64 = 64 << 10;
/// TLS material and credentials files (a CA bundle of every public root is about 250 KB).
pub(crate) const LARGE: u64 = 16 << 20;

/// The bytes of the regular file at `path`, at most `limit` of them.
pub(crate) fn bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("larger than {} KiB", limit >> 10),
        ));
    }
    Ok(bytes)
}

/// [`bounded`], as UTF-8 text (`InvalidData` if it is not).
pub(crate) fn bounded_text(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(bounded(path, limit)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// [`bounded_text`] off the runtime's threads.
pub(crate) async fn bounded_text_async(path: &Path, limit: u64) -> io::Result<String> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || bounded_text(&path, limit))
        .await
        .map_err(io::Error::other)?
}

/// [`bounded`] off the runtime's threads.
pub(crate) async fn bounded_async(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || bounded(&path, limit))
        .await
        .map_err(io::Error::other)?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO is refused at once (it would wait for a writer), a file past the limit is
    /// refused, and a regular file within it is read.
    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let dir = std::env::temp_dir().join(format!("legate-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let err = bounded(&fifo, SMALL).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let big = dir.join("big");
        std::fs::write(&big, vec![b'k'; 2049]).unwrap();
        assert!(bounded(&big, 2048).is_err());
        assert_eq!(bounded(&big, 4096).unwrap().len(), 2049);
        assert!(bounded(&dir, SMALL).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
