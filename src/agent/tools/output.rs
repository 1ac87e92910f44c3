//! Bounded capture of a command's output: the first and the last bytes are kept, the middle is
//! counted and dropped, so a command that prints gigabytes costs a fixed amount of memory and
//! the model still sees how it started and how it ended.

use std::collections::VecDeque;

#[derive(Debug, Clone)]
pub(super) struct HeadTail {
    cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl HeadTail {
    /// Keeps up to `cap` bytes of head and `cap` bytes of tail.
    pub(super) fn new(cap: usize) -> HeadTail {
        HeadTail {
            cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    pub(super) fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.cap - self.head.len();
        if room > 0 {
            let take = room.min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if bytes.len() >= self.cap {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.cap..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.cap);
        self.tail.drain(..overflow);
        self.tail.extend(bytes);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Head and tail as text (lossy UTF-8), with a marker where bytes were dropped.
    pub(super) fn render(&self) -> String {
        let omitted = self.total - (self.head.len() + self.tail.len()) as u64;
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        if omitted == 0 {
            // Nothing dropped: decode as one piece, so a character split between head and
            // tail stays whole.
            let mut all = self.head.clone();
            all.extend_from_slice(&tail);
            return String::from_utf8_lossy(&all).into_owned();
        }
        format!(
            "{}\n[… {omitted} bytes omitted …]\n{}",
            String::from_utf8_lossy(&self.head),
            String::from_utf8_lossy(&tail)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What the capture must equal, computed on the whole output at once.
    fn expected(all: &[u8], cap: usize) -> String {
        if all.len() <= 2 * cap {
            return String::from_utf8_lossy(all).into_owned();
        }
        let omitted = all.len() - 2 * cap;
        format!(
            "{}\n[… {omitted} bytes omitted …]\n{}",
            String::from_utf8_lossy(&all[..cap]),
            String::from_utf8_lossy(&all[all.len() - cap..])
        )
    }

    proptest! {
        #[test]
        fn any_chunking_keeps_exactly_head_and_tail(
            all in proptest::collection::vec(any::<u8>(), 0..200),
            cuts in proptest::collection::vec(0usize..200, 0..8),
            cap in 1usize..40,
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(all.len())).collect();
            cuts.sort_unstable();
            let mut capture = HeadTail::new(cap);
            let mut start = 0;
            for cut in cuts.into_iter().chain(std::iter::once(all.len())) {
                capture.push(&all[start..cut]);
                start = cut;
            }
            prop_assert_eq!(capture.render(), expected(&all, cap));
            prop_assert_eq!(capture.is_empty(), all.is_empty());
        }
    }

    #[test]
    fn marks_the_omitted_middle() {
        let mut capture = HeadTail::new(3);
        capture.push(b"abcdefghij");
        assert_eq!(capture.render(), "abc\n[… 4 bytes omitted …]\nhij");
    }
}
