//! Encoding helpers: a message is opened with its type byte, fields are appended, and the length
//! is back-patched when the message is closed. Nothing here allocates beyond growing the buffer.

/// Appends one message to `buf`: writes the tag and a placeholder length, runs `fields`, then
/// back-patches the length. Pass `None` for untagged startup packets.
pub fn message(buf: &mut Vec<u8>, tag: Option<u8>, fields: impl FnOnce(&mut Vec<u8>)) {
    if let Some(tag) = tag {
        buf.push(tag);
    }
    let length_at = buf.len();
    buf.extend_from_slice(&[0; 4]);
    fields(buf);
    let length = u32::try_from(buf.len() - length_at).expect("a message never exceeds 4 GiB");
    buf[length_at..length_at + 4].copy_from_slice(&length.to_be_bytes());
}

pub fn put_i16(buf: &mut Vec<u8>, value: i16) {
    buf.extend_from_slice(&value.to_be_bytes());
}

pub fn put_i32(buf: &mut Vec<u8>, value: i32) {
    buf.extend_from_slice(&value.to_be_bytes());
}

/// A count that the protocol carries as Int16.
pub fn put_count16(buf: &mut Vec<u8>, count: usize) {
    put_i16(buf, i16::try_from(count).expect("protocol counts fit in Int16"));
}

/// A string followed by its NUL terminator.
pub fn put_cstr(buf: &mut Vec<u8>, value: &[u8]) {
    debug_assert!(!value.contains(&0), "a C string cannot contain NUL");
    buf.extend_from_slice(value);
    buf.push(0);
}

/// An Int32 length and the bytes, or -1 for SQL NULL.
pub fn put_nullable(buf: &mut Vec<u8>, value: Option<&[u8]>) {
    match value {
        None => put_i32(buf, -1),
        Some(bytes) => {
            put_i32(buf, i32::try_from(bytes.len()).expect("a value never exceeds 2 GiB"));
            buf.extend_from_slice(bytes);
        }
    }
}
