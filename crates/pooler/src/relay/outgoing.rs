//! Bytes bound for a peer. Usually they are one run of the read buffer, written as is; once the
//! relay inserts, drops or rewrites a message, the run is copied into a scratch buffer and the
//! rest follows there. Unchanged traffic is never copied.

use std::ops::Range;

pub struct Outgoing<'a> {
    source: &'a [u8],
    run: Range<usize>,
    copy: &'a mut Vec<u8>,
    copying: bool,
}

impl<'a> Outgoing<'a> {
    /// `source` is the read buffer's pending bytes; `copy` a reusable scratch buffer.
    pub fn new(source: &'a [u8], copy: &'a mut Vec<u8>) -> Self {
        copy.clear();
        Outgoing { source, run: 0..0, copy, copying: false }
    }

    /// Forwards `range` of the source unchanged.
    pub fn pass(&mut self, range: Range<usize>) {
        if self.copying {
            self.copy.extend_from_slice(&self.source[range]);
        } else if self.run.is_empty() {
            self.run = range;
        } else if range.start == self.run.end {
            self.run.end = range.end;
        } else {
            self.start_copy();
            self.copy.extend_from_slice(&self.source[range]);
        }
    }

    /// Drops `range` of the source: it is not sent.
    pub fn drop_range(&mut self, _range: Range<usize>) {
        self.start_copy();
    }

    /// Sends `bytes` at this point of the stream.
    pub fn insert(&mut self, bytes: &[u8]) {
        self.start_copy();
        self.copy.extend_from_slice(bytes);
    }

    /// Appends at this point with a writer, for messages encoded in place.
    pub fn insert_with(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        self.start_copy();
        encode(self.copy);
    }

    fn start_copy(&mut self) {
        if !self.copying {
            self.copy.extend_from_slice(&self.source[self.run.clone()]);
            self.copying = true;
        }
    }

    pub fn bytes(&self) -> &[u8] {
        if self.copying {
            self.copy
        } else {
            &self.source[self.run.clone()]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_passes_stay_a_borrowed_run_and_changes_copy() {
        let source = b"aabbccdd";
        let mut scratch = Vec::new();
        let mut out = Outgoing::new(source, &mut scratch);
        out.pass(0..2);
        out.pass(2..4);
        assert_eq!(out.bytes(), b"aabb");
        out.drop_range(4..6);
        out.insert(b"XY");
        out.pass(6..8);
        assert_eq!(out.bytes(), b"aabbXYdd");
    }
}
