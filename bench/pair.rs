//! The two sides of every comparison, direct to the mock and via legate, and the ABBA order in
//! which they take turns so that drift in the machine's load falls on both alike.

/// The same thing for each side of the comparison.
#[derive(Debug, Default, Clone)]
pub(crate) struct Pair<T> {
    pub direct: T,
    pub legate: T,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Direct,
    Legate,
}

impl<T> Pair<T> {
    pub(crate) fn get(&self, side: Side) -> &T {
        match side {
            Side::Direct => &self.direct,
            Side::Legate => &self.legate,
        }
    }

    pub(crate) fn get_mut(&mut self, side: Side) -> &mut T {
        match side {
            Side::Direct => &mut self.direct,
            Side::Legate => &mut self.legate,
        }
    }
}

/// ABBA: which side goes first alternates every round (direct, legate, legate, direct, …),
/// so neither side is always the one that follows the other.
pub(crate) fn order(round: u64) -> [Side; 2] {
    if round % 2 == 0 {
        [Side::Direct, Side::Legate]
    } else {
        [Side::Legate, Side::Direct]
    }
}

/// The side of the `k`-th request in an interleaved sequence: pairs in ABBA order.
pub(crate) fn interleaved(k: u64) -> Side {
    let [first, second] = order(k / 2);
    if k % 2 == 0 { first } else { second }
}
