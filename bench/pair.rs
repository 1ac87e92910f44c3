//! The sides of every comparison (the mock directly, legate in front of it, and nginx in front
//! of it when nginx is installed) and the order in which they take turns, so that drift in the
//! machine's load falls on all of them alike.

/// Position of each side in the per-side vectors: the mock first, then legate, then nginx.
pub(crate) const DIRECT: usize = 0;
pub(crate) const LEGATE: usize = 1;
pub(crate) const NGINX: usize = 2;

/// Column names, by position.
pub(crate) const NAMES: [&str; 3] = ["direct mock", "via legate", "via nginx"];

/// Which side goes first alternates every round: forwards, then backwards (ABBA for two
/// sides, ABCCBA for three), so no side always follows the same other one.
pub(crate) fn order(round: u64, sides: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..sides).collect();
    if round % 2 == 1 {
        v.reverse();
    }
    v
}

/// The side of the `k`-th request in an interleaved sequence over `sides` sides.
pub(crate) fn interleaved(k: u64, sides: usize) -> usize {
    let n = sides.max(1) as u64;
    order(k / n, sides)[(k % n) as usize]
}
