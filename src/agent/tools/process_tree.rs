//! Killing everything a command started: its process group, and the descendants that left
//! the group (`setsid`, a shell's `set -m` jobs) while their parents still run. Those are found
//! through `/proc`'s parent links; each is stopped as it is found, so that none forks a
//! child the walk would miss, and then all are killed at once.
//!
//! A process whose parent exited before the kill (a daemon that forked twice) has been handed
//! to init and is no longer anyone's descendant: that is the bound of what this finds.
//! Signals go through kill(1): legate forbids unsafe code, and the standard library only
//! signals its own children.

use std::collections::BTreeSet;
use std::process::Stdio;

/// Walks of the tree before the kill: each finds the children of those stopped by the one
/// before; a command still forking after this many rounds is killed with what was found.
const ROUNDS: usize = 8;

/// Kills the process group led by `pid` and every descendant of `pid`. `pid` must be a
/// child of this process not reaped yet, so that it is still the command's shell.
pub(super) fn kill_tree(pid: u32) {
    let group = format!("-{pid}");
    signal("-STOP", std::iter::once(group.clone()));
    let mut found: BTreeSet<u32> = BTreeSet::new();
    for _ in 0..ROUNDS {
        let new: Vec<u32> = descendants(pid)
            .into_iter()
            .filter(|p| !found.contains(p))
            .collect();
        if new.is_empty() {
            break;
        }
        signal("-STOP", new.iter().map(u32::to_string));
        found.extend(new);
    }
    let all = std::iter::once(group).chain(found.iter().map(u32::to_string));
    signal("-KILL", all);
}

/// Kills the process group led by `pid` (not what left it).
pub(super) fn kill_group(pid: u32) {
    signal("-KILL", std::iter::once(format!("-{pid}")));
}

/// Sends `sig` to `targets` (pids, or `-pgid` for a group) in one kill(1) call. Targets gone
/// meanwhile make kill report an error for them alone; the others are signalled.
fn signal(sig: &str, targets: impl Iterator<Item = String>) {
    let _ = std::process::Command::new("kill")
        .arg(sig)
        .arg("--")
        .args(targets)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Every live process descended from `root`, read from `/proc` (empty where there is none).
fn descendants(root: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let links: Vec<(u32, u32)> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, _) in links
            .iter()
            .filter(|(pid, pp)| *pp == parent && *pid != root)
        {
            if !out.contains(&pid) {
                out.push(pid);
                frontier.push(pid);
            }
        }
    }
    out
}

/// The parent of `pid`, from `/proc/PID/stat` (`pid (comm) state ppid …`; the command name
/// may hold spaces and parentheses, so the fields are read after its last `)`).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_its_parents_child() {
        let me = std::process::id();
        let parent = parent_of(me);
        assert!(parent.is_some_and(|p| p != me), "{parent:?}");
        assert!(parent.is_some_and(|p| descendants(p).contains(&me)));
        assert!(!descendants(me).contains(&me));
    }
}
