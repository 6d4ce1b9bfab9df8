//! A bounds-checked cursor over a message body. Every read returns a typed error on short input.

use crate::error::{WireError, WireResult};

/// Reads fields from one message body; `tag` names the message in errors.
pub struct FieldReader<'a> {
    bytes: &'a [u8],
    tag: char,
}

impl<'a> FieldReader<'a> {
    pub fn new(tag: u8, bytes: &'a [u8]) -> Self {
        FieldReader { bytes, tag: tag as char }
    }

    pub fn remaining(&self) -> &'a [u8] {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn truncated(&self, field: &'static str) -> WireError {
        WireError::Truncated { tag: self.tag, field }
    }

    pub fn bad(&self, field: &'static str) -> WireError {
        WireError::BadField { tag: self.tag, field }
    }

    pub fn take(&mut self, count: usize, field: &'static str) -> WireResult<&'a [u8]> {
        if self.bytes.len() < count {
            return Err(self.truncated(field));
        }
        let (head, tail) = self.bytes.split_at(count);
        self.bytes = tail;
        Ok(head)
    }

    pub fn u8(&mut self, field: &'static str) -> WireResult<u8> {
        Ok(self.take(1, field)?[0])
    }

    pub fn i16(&mut self, field: &'static str) -> WireResult<i16> {
        let raw = self.take(2, field)?;
        Ok(i16::from_be_bytes([raw[0], raw[1]]))
    }

    pub fn i32(&mut self, field: &'static str) -> WireResult<i32> {
        let raw = self.take(4, field)?;
        Ok(i32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]))
    }

    /// A count field: an Int16 that must not be negative.
    pub fn count16(&mut self, field: &'static str) -> WireResult<usize> {
        let value = self.i16(field)?;
        usize::try_from(value).map_err(|_| self.bad(field))
    }

    /// A NUL-terminated string, returned without its terminator.
    pub fn cstr(&mut self, field: &'static str) -> WireResult<&'a [u8]> {
        let end = self.bytes.iter().position(|&b| b == 0).ok_or_else(|| self.truncated(field))?;
        let value = &self.bytes[..end];
        self.bytes = &self.bytes[end + 1..];
        Ok(value)
    }

    /// An Int32 length followed by that many bytes; length -1 means SQL NULL.
    pub fn nullable_bytes(&mut self, field: &'static str) -> WireResult<Option<&'a [u8]>> {
        let length = self.i32(field)?;
        if length == -1 {
            return Ok(None);
        }
        let length = usize::try_from(length).map_err(|_| self.bad(field))?;
        self.take(length, field).map(Some)
    }

    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> WireResult<()> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(WireError::TrailingBytes { tag: self.tag, extra: self.bytes.len() })
        }
    }
}
