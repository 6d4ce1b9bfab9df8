//! The untagged packets a client may send first: StartupMessage, SSLRequest, GSSENCRequest and
//! CancelRequest. They share one shape: Int32 length, Int32 code, payload.

use crate::error::{WireError, WireResult, STARTUP_TAG};
use crate::read::FieldReader;
use crate::write::{message, put_cstr, put_i32};

/// Protocol 3.0 as the startup code carries it.
pub const PROTOCOL_3_0: i32 = 196_608;
pub const SSL_REQUEST_CODE: i32 = 80_877_103;
pub const GSSENC_REQUEST_CODE: i32 = 80_877_104;
pub const CANCEL_REQUEST_CODE: i32 = 80_877_102;
/// A startup packet this large is a client error; PostgreSQL uses the same limit.
pub const STARTUP_PACKET_MAX: u32 = 10_000;

/// A decoded startup-phase packet; strings borrow from the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupPacket<'a> {
    Startup(StartupParams<'a>),
    SslRequest,
    GssEncRequest,
    /// `secret_key` is 4 bytes in protocol 3.0 and up to 256 bytes in 3.2.
    Cancel {
        process_id: i32,
        secret_key: &'a [u8],
    },
}

/// The parameters of a StartupMessage, in wire order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupParams<'a> {
    pub minor_version: u16,
    /// Raw `name\0value\0...` pairs without the final terminator; walk them with [`Self::iter`].
    raw: &'a [u8],
}

impl<'a> StartupParams<'a> {
    pub fn iter(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let mut fields = self.raw.split(|&b| b == 0);
        std::iter::from_fn(move || Some((fields.next()?, fields.next()?)))
    }

    pub fn get(&self, name: &str) -> Option<&'a [u8]> {
        self.iter().find(|(key, _)| *key == name.as_bytes()).map(|(_, value)| value)
    }
}

/// Decodes a startup packet at the start of `buf`; `Ok(None)` if more bytes are needed.
/// Returns the packet and the number of bytes it used.
pub fn decode_startup(buf: &[u8]) -> WireResult<Option<(StartupPacket<'_>, usize)>> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let length = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if !(8..=STARTUP_PACKET_MAX as i32).contains(&length) {
        return Err(length_error(length));
    }
    let length = length as usize;
    if buf.len() < length {
        return Ok(None);
    }
    let mut fields = FieldReader::new(0, &buf[4..length]);
    let code = fields.i32("protocol code")?;
    let packet = match code {
        SSL_REQUEST_CODE => finish(StartupPacket::SslRequest, &fields)?,
        GSSENC_REQUEST_CODE => finish(StartupPacket::GssEncRequest, &fields)?,
        CANCEL_REQUEST_CODE => decode_cancel(&mut fields)?,
        _ => decode_params(code, fields)?,
    };
    Ok(Some((packet, length)))
}

fn length_error(length: i32) -> WireError {
    if length > STARTUP_PACKET_MAX as i32 {
        WireError::TooLarge { length: length as u64, limit: STARTUP_PACKET_MAX }
    } else {
        WireError::BadLength { tag: STARTUP_TAG, length: i64::from(length) }
    }
}

fn finish<'a>(packet: StartupPacket<'a>, fields: &FieldReader<'a>) -> WireResult<StartupPacket<'a>> {
    fields.finish()?;
    Ok(packet)
}

fn decode_cancel<'a>(fields: &mut FieldReader<'a>) -> WireResult<StartupPacket<'a>> {
    let process_id = fields.i32("process id")?;
    let secret_key = fields.remaining();
    if !(4..=256).contains(&secret_key.len()) {
        return Err(fields.bad("cancel key length"));
    }
    Ok(StartupPacket::Cancel { process_id, secret_key })
}

fn decode_params(code: i32, fields: FieldReader<'_>) -> WireResult<StartupPacket<'_>> {
    let major = (code >> 16) as u16;
    let minor = (code & 0xffff) as u16;
    if major != 3 {
        return Err(WireError::UnsupportedProtocol { major, minor });
    }
    // Body: `name\0value\0` pairs, then one NUL that ends the list.
    let Some((&0, pairs)) = fields.remaining().split_last() else {
        return Err(fields.bad("parameter list terminator"));
    };
    let nul_count = pairs.iter().filter(|&&b| b == 0).count();
    if !pairs.is_empty() && (pairs.last() != Some(&0) || nul_count % 2 != 0) {
        return Err(fields.bad("parameter list"));
    }
    let raw = pairs.strip_suffix(&[0]).unwrap_or(pairs);
    let params = StartupParams { minor_version: minor, raw };
    if params.iter().any(|(name, _)| name.is_empty()) {
        return Err(fields.bad("parameter name"));
    }
    Ok(StartupPacket::Startup(params))
}

/// What a StartupMessage asks for, copied out of the packet (strings as lossy UTF-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupRequest {
    pub user: String,
    /// The `database` parameter, or the user name when it is absent or empty (as PostgreSQL).
    pub database: String,
    pub minor_version: u16,
    /// Every other parameter in wire order (`application_name`, `options`, `DateStyle`, …).
    pub parameters: Vec<(String, String)>,
    /// `_pq_.*` protocol options, none of which this codec implements.
    pub protocol_options: Vec<String>,
}

impl StartupRequest {
    /// Reads user, database and the other parameters; a missing user is PostgreSQL's 28000.
    pub fn from_params(params: &StartupParams<'_>) -> Result<Self, crate::auth::Refusal> {
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        let user = params.get("user").filter(|user| !user.is_empty()).map(text).ok_or_else(|| {
            crate::auth::Refusal::new(
                crate::SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
                "no PostgreSQL user name specified in startup packet",
            )
        })?;
        let database = params.get("database").filter(|db| !db.is_empty()).map(text).unwrap_or_else(|| user.clone());
        let mut parameters = Vec::new();
        let mut protocol_options = Vec::new();
        for (name, value) in params.iter() {
            match name {
                b"user" | b"database" => {}
                _ if name.starts_with(b"_pq_.") => protocol_options.push(text(name)),
                _ => parameters.push((text(name), text(value))),
            }
        }
        Ok(StartupRequest { user, database, minor_version: params.minor_version, parameters, protocol_options })
    }

    /// The value of a parameter other than user and database.
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    /// Appends a NegotiateProtocolVersion (3.0, every `_pq_` option unrecognized) when the client
    /// asked for a newer minor version or for protocol options; returns whether it did.
    pub fn write_negotiation(&self, out: &mut Vec<u8>) -> bool {
        if self.minor_version == 0 && self.protocol_options.is_empty() {
            return false;
        }
        let mut raw = Vec::new();
        for name in &self.protocol_options {
            put_cstr(&mut raw, name.as_bytes());
        }
        let unrecognized = crate::backend::ValueListOfStrings { count: self.protocol_options.len(), raw: &raw };
        crate::BackendMessage::NegotiateProtocolVersion { newest_minor: 0, unrecognized }.encode(out);
        true
    }
}

/// Encodes a protocol 3.0 StartupMessage with the given parameters.
pub fn encode_startup(buf: &mut Vec<u8>, params: &[(&str, &str)]) {
    message(buf, None, |buf| {
        put_i32(buf, PROTOCOL_3_0);
        for (name, value) in params {
            put_cstr(buf, name.as_bytes());
            put_cstr(buf, value.as_bytes());
        }
        buf.push(0);
    });
}

/// Encodes an SSLRequest, GSSENCRequest or CancelRequest.
pub fn encode_request(buf: &mut Vec<u8>, packet: &StartupPacket<'_>) {
    message(buf, None, |buf| match packet {
        StartupPacket::SslRequest => put_i32(buf, SSL_REQUEST_CODE),
        StartupPacket::GssEncRequest => put_i32(buf, GSSENC_REQUEST_CODE),
        StartupPacket::Cancel { process_id, secret_key } => {
            put_i32(buf, CANCEL_REQUEST_CODE);
            put_i32(buf, *process_id);
            buf.extend_from_slice(secret_key);
        }
        StartupPacket::Startup(params) => {
            put_i32(buf, (3 << 16) | i32::from(params.minor_version));
            for (name, value) in params.iter() {
                put_cstr(buf, name);
                put_cstr(buf, value);
            }
            buf.push(0);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_params_round_trip() {
        let mut buf = Vec::new();
        encode_startup(&mut buf, &[("user", "alice"), ("database", "shop")]);
        let (packet, used) = decode_startup(&buf).expect("valid").expect("complete");
        assert_eq!(used, buf.len());
        let StartupPacket::Startup(params) = packet else { panic!("not a startup message") };
        assert_eq!(params.get("user"), Some(&b"alice"[..]));
        assert_eq!(params.get("database"), Some(&b"shop"[..]));
        assert_eq!(params.iter().count(), 2);
    }

    #[test]
    fn truncated_and_malformed_startup_packets_are_errors() {
        assert_eq!(decode_startup(&[0, 0, 0, 9, 0, 3]), Ok(None));
        assert!(decode_startup(&[0, 0, 0, 3, 0, 0, 0, 0]).is_err());
        assert!(decode_startup(&[0, 1, 0, 0]).is_err());
        // Protocol 3.0 with a parameter name but no value.
        assert!(decode_startup(&[0, 0, 0, 11, 0, 3, 0, 0, b'u', 0, 0]).is_err());
        // Protocol 2.0 is refused.
        assert!(matches!(
            decode_startup(&[0, 0, 0, 9, 0, 2, 0, 0, 0]),
            Err(WireError::UnsupportedProtocol { major: 2, .. })
        ));
    }

    #[test]
    fn cancel_request_round_trip() {
        let mut buf = Vec::new();
        encode_request(&mut buf, &StartupPacket::Cancel { process_id: 42, secret_key: &[1, 2, 3, 4] });
        let (packet, _) = decode_startup(&buf).expect("valid").expect("complete");
        assert_eq!(packet, StartupPacket::Cancel { process_id: 42, secret_key: &[1, 2, 3, 4] });
    }
}
