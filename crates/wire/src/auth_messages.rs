//! The bodies of message `'p'`, whose meaning depends on the authentication request it answers:
//! PasswordMessage, SASLInitialResponse or SASLResponse.

use crate::error::WireResult;
use crate::read::FieldReader;
use crate::tag;
use crate::write::{message, put_cstr, put_nullable};

/// A PasswordMessage: the password (or MD5 response) without its terminator.
pub fn decode_password(body: &[u8]) -> WireResult<&[u8]> {
    let mut reader = FieldReader::new(tag::frontend::PASSWORD, body);
    let password = reader.cstr("password")?;
    reader.finish()?;
    Ok(password)
}

/// A SASLInitialResponse: mechanism name and the optional initial client response.
pub fn decode_sasl_initial(body: &[u8]) -> WireResult<(&[u8], Option<&[u8]>)> {
    let mut reader = FieldReader::new(tag::frontend::PASSWORD, body);
    let mechanism = reader.cstr("mechanism")?;
    let data = reader.nullable_bytes("initial response")?;
    reader.finish()?;
    Ok((mechanism, data))
}

pub fn encode_password(buf: &mut Vec<u8>, password: &[u8]) {
    message(buf, Some(tag::frontend::PASSWORD), |buf| put_cstr(buf, password));
}

pub fn encode_sasl_initial(buf: &mut Vec<u8>, mechanism: &str, data: &[u8]) {
    message(buf, Some(tag::frontend::PASSWORD), |buf| {
        put_cstr(buf, mechanism.as_bytes());
        put_nullable(buf, Some(data));
    });
}

pub fn encode_sasl_response(buf: &mut Vec<u8>, data: &[u8]) {
    message(buf, Some(tag::frontend::PASSWORD), |buf| buf.extend_from_slice(data));
}
