//! A fixed-capacity read buffer: bytes are read into the tail and consumed from the head, so a
//! connection reuses one allocation for its whole life. Memory only: the crates that do I/O read
//! into [`Buffer::spare`] and [`Buffer::commit`] what they read.

/// Bytes received but not yet consumed live in `bytes[start..end]`.
pub struct Buffer {
    bytes: Box<[u8]>,
    start: usize,
    end: usize,
    /// Bytes committed over the buffer's life (the kernel fast path compares it with the bytes
    /// it passed to user space before it forwards a client's traffic again).
    committed: u64,
}

impl Buffer {
    pub fn with_capacity(capacity: usize) -> Self {
        assert!(capacity >= crate::HEADER_LEN, "a buffer holds at least a message header");
        Buffer { bytes: vec![0; capacity].into_boxed_slice(), start: 0, end: 0, committed: 0 }
    }

    pub fn capacity(&self) -> usize {
        self.bytes.len()
    }

    pub fn pending(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    pub fn consume(&mut self, count: usize) {
        assert!(count <= self.end - self.start, "consumed more than was read");
        self.start += count;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Free space at the tail, after moving pending bytes to the front if that makes room.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start > 0 && self.end == self.bytes.len() {
            self.bytes.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.bytes[self.end..]
    }

    /// Marks `count` bytes written into [`Self::spare`] as received.
    pub fn commit(&mut self, count: usize) {
        assert!(self.end + count <= self.bytes.len(), "committed past the buffer");
        self.end += count;
        self.committed += count as u64;
    }

    /// Bytes committed (read into the buffer) since it was made.
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// Appends bytes (the caller checked they fit).
    pub fn push(&mut self, bytes: &[u8]) {
        let spare = self.spare();
        assert!(bytes.len() <= spare.len(), "pushed more than fits");
        spare[..bytes.len()].copy_from_slice(bytes);
        self.commit(bytes.len());
    }

    pub fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compacts_only_when_the_tail_is_full() {
        let mut buffer = Buffer::with_capacity(8);
        buffer.spare()[..8].copy_from_slice(b"abcdefgh");
        buffer.commit(8);
        buffer.consume(6);
        assert_eq!(buffer.spare().len(), 6);
        assert_eq!(buffer.pending(), b"gh");
        buffer.consume(2);
        assert!(buffer.is_empty());
        assert_eq!(buffer.spare().len(), 8);
    }
}
