//! Provider credentials: a redacting [`Secret`] wrapper, where a key comes from
//! ([`KeySource`]), and the live key a request reads ([`KeyCell`]), which follows a key file
//! through rotations without a restart.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;

/// How often a key file is re-read. Kubernetes updates mounted Secrets within about a minute,
/// so a quarter second is far below anything an operator could notice, and reading a tiny file
/// four times a second costs nothing.
const WATCH_PERIOD: Duration = Duration::from_millis(250);

/// A secret string: `Debug` and `Display` print `[redacted]`; the value is reachable only
/// through [`Secret::expose`], so it cannot end up in a log line by accident.
#[derive(Clone)]
pub struct Secret {
    value: String,
    /// The searcher that finds the value in what an upstream sends back (`redact`), built on
    /// first use and kept as long as the key is: building one per request cost more than the
    /// searches it serves. Boxed: a searcher is a few hundred bytes, and `Secret` sits in
    /// enums.
    finder: std::sync::OnceLock<Box<memchr::memmem::Finder<'static>>>,
    /// The value as a request header, as is and as `Bearer <value>`, rendered on first use
    /// and marked sensitive: every upstream request carries one, and rendering it each time
    /// cost an allocation or two and a copy of the key. `None` where the key holds characters
    /// a header cannot.
    headers: std::sync::OnceLock<Box<AuthValues>>,
}

/// A key rendered as header values.
#[derive(Clone)]
struct AuthValues {
    plain: Option<http::HeaderValue>,
    bearer: Option<http::HeaderValue>,
}

impl Secret {
    pub fn new(value: String) -> Self {
        Secret {
            value,
            finder: std::sync::OnceLock::new(),
            headers: std::sync::OnceLock::new(),
        }
    }

    /// The value as a header value (`Bearer <value>` when `bearer`), marked sensitive so that
    /// hyper and `Debug` never print it; `None` if the key cannot be a header value.
    pub fn header_value(&self, bearer: bool) -> Option<http::HeaderValue> {
        let values = self.headers.get_or_init(|| {
            let sensitive = |v: Result<http::HeaderValue, _>| {
                v.ok().map(|mut v: http::HeaderValue| {
                    v.set_sensitive(true);
                    v
                })
            };
            Box::new(AuthValues {
                plain: sensitive(http::HeaderValue::from_str(&self.value)),
                bearer: sensitive(http::HeaderValue::from_str(&format!(
                    "Bearer {}",
                    self.value
                ))),
            })
        });
        if bearer {
            values.bearer.clone()
        } else {
            values.plain.clone()
        }
    }

    pub fn expose(&self) -> &str {
        &self.value
    }

    /// A searcher for the value (see `redact`).
    pub fn finder(&self) -> &memchr::memmem::Finder<'static> {
        self.finder.get_or_init(|| {
            Box::new(memchr::memmem::Finder::new(self.value.as_bytes()).into_owned())
        })
    }
}

/// Two secrets are equal when their values are (a reload compares credential sources).
impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl Eq for Secret {}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Serialising shows the mask, never the value: `legate check` prints the effective config by
/// serialising it.
impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("[redacted]")
    }
}

impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret::new)
    }
}

/// Where a provider's key comes from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// An environment variable, read once at load time; `value` is `None` when it is unset or
    /// empty (not an error: legate must start on a machine without keys).
    Env { var: String, value: Option<Secret> },
    /// A file, re-read while legate runs (key rotation without restart).
    File { path: PathBuf },
    /// No key: requests go out without credentials (local OpenAI-compatible servers).
    None,
}

/// The live provider key, cheap to read on every request.
pub struct KeyCell {
    current: ArcSwapOption<Secret>,
    /// The key the last rotation replaced: still valid at the provider for a while, and what
    /// an answer to a request sent just before it would echo, so answers are searched for it
    /// too (`redact`).
    previous: ArcSwapOption<Secret>,
    /// Set for file-backed keys only.
    path: Option<PathBuf>,
}

impl fmt::Debug for KeyCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyCell")
            .field("path", &self.path)
            .field(
                "current",
                &self.current.load().as_ref().map(|_| "[redacted]"),
            )
            .finish()
    }
}

impl KeyCell {
    /// An environment key is fixed for the life of the process; a file key is read once now
    /// (a failure is logged and leaves the cell empty until the watcher succeeds).
    pub fn from_source(src: &KeySource) -> Self {
        match src {
            KeySource::Env { value, .. } => Self {
                current: ArcSwapOption::new(value.clone().map(Arc::new)),
                previous: ArcSwapOption::empty(),
                path: None,
            },
            KeySource::File { path } => {
                let initial = match read_key_file(path) {
                    Ok(key) => Some(Arc::new(key)),
                    Err(err) => {
                        warn_unreadable(path, &err, false);
                        None
                    }
                };
                Self {
                    current: ArcSwapOption::new(initial),
                    previous: ArcSwapOption::empty(),
                    path: Some(path.clone()),
                }
            }
            KeySource::None => Self {
                current: ArcSwapOption::empty(),
                previous: ArcSwapOption::empty(),
                path: None,
            },
        }
    }

    /// The key to send now, if any.
    pub fn current(&self) -> Option<Arc<Secret>> {
        self.current.load_full()
    }

    /// The key the last rotation replaced, if any (never sent again).
    pub fn previous(&self) -> Option<Arc<Secret>> {
        self.previous.load_full()
    }

    /// For a file-backed key, starts a task that re-reads the file every 250 ms and swaps in a
    /// changed key. The file is re-opened by path each time because Kubernetes rotates mounted
    /// Secrets by swapping a symlink, which an inode watch would miss. A missing or unreadable
    /// file keeps the last good key. The task ends when the cell is dropped. Must be called
    /// inside a Tokio runtime; returns `None` for keys that never change.
    pub fn spawn_watch(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let path = self.path.clone()?;
        let cell = Arc::downgrade(self);
        Some(tokio::spawn(watch(cell, path)))
    }

    /// Replaces the key if `fresh` differs from the current one. Returns whether it changed.
    fn update(&self, fresh: Secret) -> bool {
        let unchanged = self
            .current
            .load()
            .as_ref()
            .is_some_and(|old| old.expose() == fresh.expose());
        if !unchanged {
            let old = self.current.swap(Some(Arc::new(fresh)));
            if old.is_some() {
                self.previous.store(old);
            }
        }
        !unchanged
    }
}

async fn watch(cell: Weak<KeyCell>, path: PathBuf) {
    let mut tick = tokio::time::interval(WATCH_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = None;
    loop {
        tick.tick().await;
        let Some(cell) = cell.upgrade() else {
            return;
        };
        poll_once(&cell, &path, &mut failing).await;
    }
}

/// One re-read of the key file. `failing` remembers an ongoing failure (what was wrong) so the
/// warning is logged once per kind of failure rather than four times a second: an empty file
/// that is then deleted is told twice, since the operator's fix differs.
async fn poll_once(cell: &KeyCell, path: &Path, failing: &mut Option<String>) {
    match read_key_file_async(path).await {
        Ok(key) => {
            if cell.update(key) {
                tracing::info!(path = %path.display(), "provider key file changed; using the new key");
            }
            *failing = None;
        }
        Err(err) => {
            let why = err.to_string();
            if failing.as_deref() != Some(why.as_str()) {
                warn_unreadable(path, &err, cell.current().is_some());
                *failing = Some(why);
            }
        }
    }
}

fn warn_unreadable(path: &Path, err: &io::Error, has_key: bool) {
    if has_key {
        tracing::warn!(
            path = %path.display(),
            error = %err,
            "cannot read provider key file; keeping the last good key"
        );
    } else {
        tracing::warn!(
            path = %path.display(),
            error = %err,
            "cannot read provider key file; requests to this provider go without a key until it can be read"
        );
    }
}

fn read_key_file(path: &Path) -> io::Result<Secret> {
    parse_key(super::read::bounded_text(path, super::read::SMALL)?)
}

async fn read_key_file_async(path: &Path) -> io::Result<Secret> {
    parse_key(super::read::bounded_text_async(path, super::read::SMALL).await?)
}

/// A key as a file or an environment variable holds it: a byte-order mark an editor put
/// before it and one trailing newline (files written by `echo` or editors end with one) are
/// dropped, and the spaces around it. An empty key, or one holding control characters (a
/// second newline, a NUL), is treated as unreadable: it could not be sent in a header, and a
/// half-written file must never replace a good key.
pub(crate) fn parse_key(mut text: String) -> io::Result<Secret> {
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    let key = text
        .strip_prefix('\u{feff}')
        .unwrap_or(&text)
        .trim_matches(' ');
    key_problem(key).map_or(Ok(()), |m| {
        Err(io::Error::new(io::ErrorKind::InvalidData, m))
    })?;
    if key.len() != text.len() {
        text = key.to_owned();
    }
    Ok(Secret::new(text))
}

/// Why a key's text (after its trailing newline) cannot be a key; never quotes it.
pub(crate) fn key_problem(key: &str) -> Option<&'static str> {
    if key.is_empty() {
        Some("there is no key (empty, or only spaces)")
    } else if key.chars().any(char::is_control) {
        Some("the key holds control characters (a line break, tab or NUL)")
    } else if !key.is_ascii() {
        // A key pasted from a web page often brings a no-break or zero-width space along: it
        // would be sent as its raw bytes and refused by the provider on every call.
        Some(
            "the key holds characters outside ASCII (a no-break or zero-width space pasted \
             with it?)",
        )
    } else {
        None
    }
}

/// Reads a key file the way the running proxy does, to refuse a bad one before starting.
pub(crate) fn check_key_file(path: &Path) -> Result<(), String> {
    let text = super::read::bounded_text(path, super::read::SMALL).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidData => "the file is not UTF-8 text".to_owned(),
        _ => format!("cannot read: {e}"),
    })?;
    parse_key(text).map(|_| ()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load::temp_file;

    #[test]
    fn a_key_renders_as_a_sensitive_header_value_once() {
        let key = Secret::new("sk-test-123".into());
        let plain = key.header_value(false);
        assert_eq!(
            plain.as_ref().map(|v| v.as_bytes()),
            Some(&b"sk-test-123"[..])
        );
        let bearer = key.header_value(true);
        assert_eq!(
            bearer.as_ref().map(|v| v.as_bytes()),
            Some(&b"Bearer sk-test-123"[..])
        );
        for v in [plain, bearer].into_iter().flatten() {
            assert!(v.is_sensitive());
            assert_eq!(format!("{v:?}"), "Sensitive");
        }
        // The same values again, from the cache.
        assert_eq!(
            key.header_value(false).map(|v| v.as_bytes().to_vec()),
            Some(b"sk-test-123".to_vec())
        );
        assert_eq!(format!("{key:?}"), "[redacted]");
        assert!(Secret::new("sk\nbad".into()).header_value(false).is_none());
        assert!(Secret::new("sk\nbad".into()).header_value(true).is_none());
    }

    fn exposed(cell: &KeyCell) -> Option<String> {
        cell.current().map(|s| s.expose().to_owned())
    }

    #[test]
    fn secret_is_redacted_in_debug_and_display() {
        let s = Secret::new("sk-very-secret".into());
        assert_eq!(format!("{s:?}"), "[redacted]");
        assert_eq!(format!("{s}"), "[redacted]");
        assert_eq!(s.expose(), "sk-very-secret");
        let src = KeySource::Env {
            var: "K".into(),
            value: Some(s),
        };
        assert!(!format!("{src:?}").contains("very-secret"));
    }

    #[test]
    fn env_source_is_fixed_and_none_is_empty() {
        let cell = KeyCell::from_source(&KeySource::Env {
            var: "K".into(),
            value: Some(Secret::new("abc".into())),
        });
        assert_eq!(exposed(&cell), Some("abc".into()));
        assert!(!format!("{cell:?}").contains("abc"));
        let unset = KeyCell::from_source(&KeySource::Env {
            var: "K".into(),
            value: None,
        });
        assert_eq!(exposed(&unset), None);
        assert_eq!(exposed(&KeyCell::from_source(&KeySource::None)), None);
    }

    #[test]
    fn file_key_trims_one_trailing_newline_and_refuses_a_second() -> io::Result<()> {
        let (_dir, path) = temp_file("key", "sk-1\n\n")?;
        let cell = KeyCell::from_source(&KeySource::File { path: path.clone() });
        assert_eq!(exposed(&cell), None, "a key with a line break is not a key");
        std::fs::write(&path, "sk-2\r\n")?;
        let cell = KeyCell::from_source(&KeySource::File { path });
        assert_eq!(exposed(&cell), Some("sk-2".into()));
        Ok(())
    }

    /// Spaces only is no key (it was sent as an empty credential); a byte-order mark and the
    /// spaces around a key are not part of it.
    #[test]
    fn a_key_is_read_without_spaces_or_a_byte_order_mark() {
        let key = |t: &str| parse_key(t.to_owned()).ok().map(|s| s.expose().to_owned());
        assert_eq!(key("   \n"), None);
        assert_eq!(key("\u{feff}sk-3\n"), Some("sk-3".to_owned()));
        assert_eq!(key(" sk-4 \r\n"), Some("sk-4".to_owned()));
        assert_eq!(
            key("sk-5\r"),
            None,
            "a lone carriage return is a control character"
        );
        // Pasted from a web page: a no-break space, a zero-width space.
        assert_eq!(key("sk-6\u{a0}\n"), None);
        assert_eq!(key("sk-\u{200b}7"), None);
    }

    #[test]
    fn missing_or_empty_key_file_gives_no_key() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let missing = KeyCell::from_source(&KeySource::File {
            path: dir.path().join("absent"),
        });
        assert_eq!(exposed(&missing), None);
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n")?;
        assert_eq!(
            exposed(&KeyCell::from_source(&KeySource::File { path: empty })),
            None
        );
        Ok(())
    }

    #[tokio::test]
    async fn watch_is_only_for_file_keys() {
        let cell = Arc::new(KeyCell::from_source(&KeySource::None));
        assert!(cell.spawn_watch().is_none());
    }

    /// Polls until the cell holds `want`, bounded so a broken watcher fails instead of hanging.
    async fn wait_for(cell: &KeyCell, want: Option<&str>) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            if exposed(cell).as_deref() == want {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    #[tokio::test]
    async fn picks_up_a_rotated_key_file() -> io::Result<()> {
        let (dir, path) = temp_file("key", "old-key\n")?;
        let cell = Arc::new(KeyCell::from_source(&KeySource::File {
            path: path.clone(),
        }));
        assert_eq!(exposed(&cell), Some("old-key".into()));
        let handle = cell.spawn_watch();
        assert!(handle.is_some());

        // Rotate the way an atomic writer does: a new file renamed over the old path.
        let staged = dir.path().join("key.new");
        std::fs::write(&staged, "new-key\n")?;
        std::fs::rename(&staged, &path)?;
        assert!(wait_for(&cell, Some("new-key")).await, "rotation not seen");

        if let Some(h) = handle {
            h.abort();
        }
        Ok(())
    }

    /// Kubernetes mounts a Secret as `key -> ..data/key` with `..data -> ..TIMESTAMP`, and
    /// rotates it by pointing a fresh `..data` symlink at a new directory.
    #[cfg(unix)]
    #[tokio::test]
    async fn follows_a_kubernetes_style_symlink_swap() -> io::Result<()> {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        std::fs::create_dir(root.join("..v1"))?;
        std::fs::write(root.join("..v1/key"), "first\n")?;
        symlink("..v1", root.join("..data"))?;
        symlink("..data/key", root.join("key"))?;
        let cell = Arc::new(KeyCell::from_source(&KeySource::File {
            path: root.join("key"),
        }));
        assert_eq!(exposed(&cell), Some("first".into()));
        let handle = cell.spawn_watch();

        std::fs::create_dir(root.join("..v2"))?;
        std::fs::write(root.join("..v2/key"), "second\n")?;
        symlink("..v2", root.join("..data_tmp"))?;
        std::fs::rename(root.join("..data_tmp"), root.join("..data"))?;
        std::fs::remove_dir_all(root.join("..v1"))?;
        assert!(
            wait_for(&cell, Some("second")).await,
            "symlink swap not seen"
        );
        if let Some(h) = handle {
            h.abort();
        }
        Ok(())
    }

    /// A FIFO put at the key's path for a while (or a huge file) is refused at once and the
    /// last good key kept; the watcher goes on, and takes the key a regular file brings back.
    /// The FIFO held the watcher's read for ever: every later rotation went unseen.
    #[tokio::test]
    async fn a_fifo_or_a_huge_file_at_the_path_does_not_stop_the_watcher() -> io::Result<()> {
        let (dir, path) = temp_file("key", "key-one\n")?;
        let cell = Arc::new(KeyCell::from_source(&KeySource::File {
            path: path.clone(),
        }));
        let handle = cell.spawn_watch();
        std::fs::remove_file(&path)?;
        let made = std::process::Command::new("mkfifo").arg(&path).status()?;
        assert!(made.success());
        let mut failing = None;
        poll_once(&cell, &path, &mut failing).await;
        assert!(failing.is_some_and(|f| f.contains("not a regular file")));
        std::fs::remove_file(&path)?;
        std::fs::write(&path, vec![b'k'; 100 << 10])?;
        let mut failing = None;
        poll_once(&cell, &path, &mut failing).await;
        assert!(failing.is_some_and(|f| f.contains("larger than")));
        assert_eq!(exposed(&cell), Some("key-one".into()));
        let staged = dir.path().join("key.new");
        std::fs::write(&staged, "key-two\n")?;
        std::fs::rename(&staged, &path)?;
        assert!(wait_for(&cell, Some("key-two")).await, "rotation not seen");
        if let Some(h) = handle {
            h.abort();
        }
        Ok(())
    }

    #[tokio::test]
    async fn unreadable_file_keeps_the_last_good_key() -> io::Result<()> {
        let (_dir, path) = temp_file("key", "good")?;
        let cell = KeyCell::from_source(&KeySource::File { path: path.clone() });
        let mut failing = None;
        std::fs::remove_file(&path)?;
        poll_once(&cell, &path, &mut failing).await;
        let missing = failing.clone().expect("a failure");
        assert_eq!(exposed(&cell), Some("good".into()));
        // Another kind of failure is remembered (and told) as such.
        std::fs::write(&path, "")?;
        poll_once(&cell, &path, &mut failing).await;
        assert!(
            failing.as_ref().is_some_and(|why| *why != missing),
            "{failing:?}"
        );
        assert_eq!(exposed(&cell), Some("good".into()));
        std::fs::write(&path, "better\n")?;
        poll_once(&cell, &path, &mut failing).await;
        assert!(failing.is_none());
        assert_eq!(exposed(&cell), Some("better".into()));
        Ok(())
    }

    #[tokio::test]
    async fn watcher_ends_when_the_cell_is_dropped() -> io::Result<()> {
        let (_dir, path) = temp_file("key", "k")?;
        let cell = Arc::new(KeyCell::from_source(&KeySource::File { path }));
        let handle = cell.spawn_watch();
        drop(cell);
        if let Some(h) = handle {
            let ended = tokio::time::timeout(Duration::from_secs(10), h).await;
            assert!(ended.is_ok(), "watch task outlived its cell");
        }
        Ok(())
    }
}
