//! Opening a file a tool reads or writes: only a regular file will do. A FIFO would block the
//! open or the read until some other process came along (forever, in a headless run, and again
//! on every `--resume`), and a device or socket is no file to read or edit.
//!
//! The open itself must not block, so it is non-blocking (`O_NONBLOCK` opens a FIFO at once);
//! the type is then checked on the open handle (`fstat`), not on the path before, so a file
//! swapped for a FIFO between a check and the open cannot slip through.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use super::{ToolError, io_err};

/// Opens `path` with `options` and returns the handle only if it is a regular file. `shown`
/// is the path as the model named it, for messages.
pub(crate) fn open_regular(
    options: &mut OpenOptions,
    path: &Path,
    shown: &str,
) -> Result<(File, std::fs::Metadata), ToolError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(|e| refused(e, path, shown))?;
    let meta = file.metadata().map_err(io_err(shown))?;
    if meta.is_dir() {
        return Err(ToolError::IsDirectory {
            path: shown.to_owned(),
        });
    }
    if !meta.is_file() {
        return Err(ToolError::NotRegular {
            path: shown.to_owned(),
            kind: kind(&meta),
        });
    }
    Ok((file, meta))
}

/// The error for a failed open, named for what the path is where that explains it.
fn refused(e: io::Error, path: &Path, shown: &str) -> ToolError {
    match e.kind() {
        // Opening a directory for writing fails here rather than at the type check.
        io::ErrorKind::IsADirectory => ToolError::IsDirectory {
            path: shown.to_owned(),
        },
        // A non-blocking write-only open of a FIFO no one reads fails with ENXIO, as does a
        // socket: say what the file is rather than "no such device or address".
        _ => match std::fs::metadata(path) {
            Ok(meta) if !meta.is_file() && !meta.is_dir() => ToolError::NotRegular {
                path: shown.to_owned(),
                kind: kind(&meta),
            },
            _ => io_err(shown)(e),
        },
    }
}

/// What a non-regular, non-directory file is, for the message.
fn kind(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
    }
    let _ = meta;
    "a special file"
}

#[cfg(all(test, unix))]
pub(crate) mod tests {
    use super::*;

    /// Makes a FIFO at `path`.
    pub(crate) fn mkfifo(path: &Path) -> io::Result<()> {
        let made = std::process::Command::new("mkfifo").arg(path).status()?;
        if made.success() {
            Ok(())
        } else {
            Err(io::Error::other("mkfifo failed"))
        }
    }

    /// A FIFO at `path` with a writer waiting to feed a blocking read of it: a tool that
    /// opened it without the check would read the writer's text. Dropping it lets the
    /// writer's open return, so its thread ends.
    pub(crate) struct FedFifo(std::path::PathBuf);

    pub(crate) fn fed_fifo(path: &Path) -> io::Result<FedFifo> {
        mkfifo(path)?;
        let writer_path = path.to_path_buf();
        std::thread::spawn(move || {
            use std::io::Write;
            if let Ok(mut w) = std::fs::OpenOptions::new().write(true).open(writer_path) {
                let _ = w.write_all(b"fed through the pipe");
            }
        });
        Ok(FedFifo(path.to_path_buf()))
    }

    impl Drop for FedFifo {
        fn drop(&mut self) {
            use std::os::unix::fs::OpenOptionsExt;
            drop(
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&self.0),
            );
        }
    }

    #[test]
    fn fifos_are_refused_without_blocking_and_files_opened() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let fifo = dir.path().join("pipe");
        mkfifo(&fifo)?;
        for options in [
            OpenOptions::new().read(true),
            OpenOptions::new().read(true).write(true),
            OpenOptions::new().write(true),
        ] {
            let opened = open_regular(options, &fifo, "pipe");
            assert!(
                matches!(&opened, Err(ToolError::NotRegular { kind: "a FIFO", .. })),
                "{opened:?}"
            );
        }
        std::fs::write(dir.path().join("f"), "x")?;
        let file = open_regular(OpenOptions::new().read(true), &dir.path().join("f"), "f");
        assert!(file.is_ok_and(|(_, meta)| meta.len() == 1));
        let dir_write = open_regular(OpenOptions::new().write(true), dir.path(), "d");
        assert!(matches!(dir_write, Err(ToolError::IsDirectory { .. })));
        Ok(())
    }
}
