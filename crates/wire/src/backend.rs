//! Messages a server sends. Decoding borrows from the frame and never allocates.

use crate::error::{WireError, WireResult};
use crate::frontend::{Int16List, ValueList};
use crate::read::FieldReader;
use crate::sqlstate::SqlState;
use crate::tag;
use crate::write::{message, put_count16, put_cstr, put_i16, put_i32, put_nullable};

/// The transaction status a ReadyForQuery reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionStatus {
    Idle,
    InTransaction,
    Failed,
}

impl TransactionStatus {
    pub fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            tag::status::IDLE => Some(TransactionStatus::Idle),
            tag::status::IN_TRANSACTION => Some(TransactionStatus::InTransaction),
            tag::status::FAILED => Some(TransactionStatus::Failed),
            _ => None,
        }
    }

    pub fn byte(self) -> u8 {
        match self {
            TransactionStatus::Idle => tag::status::IDLE,
            TransactionStatus::InTransaction => tag::status::IN_TRANSACTION,
            TransactionStatus::Failed => tag::status::FAILED,
        }
    }
}

/// The authentication request codes of message `'R'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authentication<'a> {
    Ok,
    CleartextPassword,
    Md5Password {
        salt: [u8; 4],
    },
    /// Mechanism names, NUL-separated, as sent.
    Sasl {
        mechanisms: &'a [u8],
    },
    SaslContinue(&'a [u8]),
    SaslFinal(&'a [u8]),
    /// Kerberos, SCM credentials, GSSAPI, SSPI: decoded so a relay can refuse them clearly.
    Unsupported {
        code: i32,
        data: &'a [u8],
    },
}

impl<'a> Authentication<'a> {
    /// True when the list of SASL mechanisms offers `name`.
    pub fn offers(&self, name: &str) -> bool {
        match self {
            Authentication::Sasl { mechanisms } => mechanisms.split(|&b| b == 0).any(|m| m == name.as_bytes()),
            _ => false,
        }
    }
}

/// A server message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendMessage<'a> {
    Authentication(Authentication<'a>),
    BackendKeyData {
        process_id: i32,
        secret_key: &'a [u8],
    },
    BindComplete,
    CloseComplete,
    CommandComplete(&'a [u8]),
    CopyData(&'a [u8]),
    CopyDone,
    CopyInResponse(CopyFormat<'a>),
    CopyOutResponse(CopyFormat<'a>),
    CopyBothResponse(CopyFormat<'a>),
    DataRow(ValueList<'a>),
    EmptyQueryResponse,
    ErrorResponse(Fields<'a>),
    FunctionCallResponse(Option<&'a [u8]>),
    NegotiateProtocolVersion {
        newest_minor: i32,
        unrecognized: ValueListOfStrings<'a>,
    },
    NoData,
    NoticeResponse(Fields<'a>),
    NotificationResponse {
        process_id: i32,
        channel: &'a [u8],
        payload: &'a [u8],
    },
    /// Parameter type OIDs as raw Int32s.
    ParameterDescription(&'a [u8]),
    ParameterStatus {
        name: &'a [u8],
        value: &'a [u8],
    },
    ParseComplete,
    PortalSuspended,
    ReadyForQuery(TransactionStatus),
    RowDescription {
        field_count: usize,
        raw: &'a [u8],
    },
}

/// The overall format and per-column formats of a Copy*Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyFormat<'a> {
    pub format: u8,
    pub column_formats: Int16List<'a>,
}

/// A counted list of C strings, kept raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueListOfStrings<'a> {
    pub count: usize,
    pub raw: &'a [u8],
}

/// The fields of an ErrorResponse or NoticeResponse: `(code, value)` pairs, kept raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields<'a> {
    raw: &'a [u8],
}

impl<'a> Fields<'a> {
    pub fn iter(&self) -> impl Iterator<Item = (u8, &'a [u8])> + 'a {
        let mut reader = FieldReader::new(tag::backend::ERROR_RESPONSE, self.raw);
        std::iter::from_fn(move || {
            let code = reader.u8("field code").ok().filter(|&c| c != 0)?;
            Some((code, reader.cstr("field value").ok()?))
        })
    }

    pub fn get(&self, code: u8) -> Option<&'a [u8]> {
        self.iter().find(|(c, _)| *c == code).map(|(_, v)| v)
    }

    /// Field `'V'` (untranslated severity), falling back to `'S'`.
    pub fn severity(&self) -> Option<&'a [u8]> {
        self.get(tag::field::SEVERITY_NONLOCALIZED).or_else(|| self.get(tag::field::SEVERITY))
    }

    pub fn code(&self) -> Option<&'a [u8]> {
        self.get(tag::field::CODE)
    }

    pub fn message(&self) -> Option<&'a [u8]> {
        self.get(tag::field::MESSAGE)
    }

    /// True for FATAL and PANIC: the server closes the connection after this.
    pub fn is_fatal(&self) -> bool {
        matches!(self.severity(), Some(b"FATAL" | b"PANIC"))
    }
}

impl<'a> BackendMessage<'a> {
    /// Decodes a message body; `tag` is its type byte.
    pub fn decode(tag: u8, body: &'a [u8]) -> WireResult<Self> {
        let mut reader = FieldReader::new(tag, body);
        let message = match tag {
            tag::backend::AUTHENTICATION => BackendMessage::Authentication(decode_authentication(&mut reader)?),
            tag::backend::BACKEND_KEY_DATA => decode_key_data(&mut reader)?,
            tag::backend::BIND_COMPLETE => BackendMessage::BindComplete,
            tag::backend::CLOSE_COMPLETE => BackendMessage::CloseComplete,
            tag::backend::COMMAND_COMPLETE => BackendMessage::CommandComplete(reader.cstr("command tag")?),
            tag::backend::COPY_DATA => BackendMessage::CopyData(take_rest(&mut reader)),
            tag::backend::COPY_DONE => BackendMessage::CopyDone,
            tag::backend::COPY_IN_RESPONSE => BackendMessage::CopyInResponse(decode_copy_format(&mut reader)?),
            tag::backend::COPY_OUT_RESPONSE => BackendMessage::CopyOutResponse(decode_copy_format(&mut reader)?),
            tag::backend::COPY_BOTH_RESPONSE => BackendMessage::CopyBothResponse(decode_copy_format(&mut reader)?),
            tag::backend::DATA_ROW => BackendMessage::DataRow(decode_values(&mut reader)?),
            tag::backend::EMPTY_QUERY_RESPONSE => BackendMessage::EmptyQueryResponse,
            tag::backend::ERROR_RESPONSE => BackendMessage::ErrorResponse(decode_fields(&mut reader)?),
            tag::backend::FUNCTION_CALL_RESPONSE => {
                BackendMessage::FunctionCallResponse(reader.nullable_bytes("result")?)
            }
            tag::backend::NEGOTIATE_PROTOCOL_VERSION => decode_negotiate(&mut reader)?,
            tag::backend::NO_DATA => BackendMessage::NoData,
            tag::backend::NOTICE_RESPONSE => BackendMessage::NoticeResponse(decode_fields(&mut reader)?),
            tag::backend::NOTIFICATION_RESPONSE => decode_notification(&mut reader)?,
            tag::backend::PARAMETER_DESCRIPTION => BackendMessage::ParameterDescription(decode_oids(&mut reader)?),
            tag::backend::PARAMETER_STATUS => {
                BackendMessage::ParameterStatus { name: reader.cstr("name")?, value: reader.cstr("value")? }
            }
            tag::backend::PARSE_COMPLETE => BackendMessage::ParseComplete,
            tag::backend::PORTAL_SUSPENDED => BackendMessage::PortalSuspended,
            tag::backend::READY_FOR_QUERY => BackendMessage::ReadyForQuery(decode_status(&mut reader)?),
            tag::backend::ROW_DESCRIPTION => decode_row_description(&mut reader)?,
            _ => return Err(WireError::UnknownTag(tag as char)),
        };
        reader.finish()?;
        Ok(message)
    }

    pub fn tag(&self) -> u8 {
        match self {
            BackendMessage::Authentication(_) => tag::backend::AUTHENTICATION,
            BackendMessage::BackendKeyData { .. } => tag::backend::BACKEND_KEY_DATA,
            BackendMessage::BindComplete => tag::backend::BIND_COMPLETE,
            BackendMessage::CloseComplete => tag::backend::CLOSE_COMPLETE,
            BackendMessage::CommandComplete(_) => tag::backend::COMMAND_COMPLETE,
            BackendMessage::CopyData(_) => tag::backend::COPY_DATA,
            BackendMessage::CopyDone => tag::backend::COPY_DONE,
            BackendMessage::CopyInResponse(_) => tag::backend::COPY_IN_RESPONSE,
            BackendMessage::CopyOutResponse(_) => tag::backend::COPY_OUT_RESPONSE,
            BackendMessage::CopyBothResponse(_) => tag::backend::COPY_BOTH_RESPONSE,
            BackendMessage::DataRow(_) => tag::backend::DATA_ROW,
            BackendMessage::EmptyQueryResponse => tag::backend::EMPTY_QUERY_RESPONSE,
            BackendMessage::ErrorResponse(_) => tag::backend::ERROR_RESPONSE,
            BackendMessage::FunctionCallResponse(_) => tag::backend::FUNCTION_CALL_RESPONSE,
            BackendMessage::NegotiateProtocolVersion { .. } => tag::backend::NEGOTIATE_PROTOCOL_VERSION,
            BackendMessage::NoData => tag::backend::NO_DATA,
            BackendMessage::NoticeResponse(_) => tag::backend::NOTICE_RESPONSE,
            BackendMessage::NotificationResponse { .. } => tag::backend::NOTIFICATION_RESPONSE,
            BackendMessage::ParameterDescription(_) => tag::backend::PARAMETER_DESCRIPTION,
            BackendMessage::ParameterStatus { .. } => tag::backend::PARAMETER_STATUS,
            BackendMessage::ParseComplete => tag::backend::PARSE_COMPLETE,
            BackendMessage::PortalSuspended => tag::backend::PORTAL_SUSPENDED,
            BackendMessage::ReadyForQuery(_) => tag::backend::READY_FOR_QUERY,
            BackendMessage::RowDescription { .. } => tag::backend::ROW_DESCRIPTION,
        }
    }

    /// Appends the whole message, header included, to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        message(buf, Some(self.tag()), |buf| self.encode_body(buf));
    }

    fn encode_body(&self, buf: &mut Vec<u8>) {
        match self {
            BackendMessage::Authentication(auth) => encode_authentication(buf, auth),
            BackendMessage::BackendKeyData { process_id, secret_key } => {
                put_i32(buf, *process_id);
                buf.extend_from_slice(secret_key);
            }
            BackendMessage::CommandComplete(text) => put_cstr(buf, text),
            BackendMessage::CopyData(data) => buf.extend_from_slice(data),
            BackendMessage::ParameterDescription(oids) => {
                put_count16(buf, oids.len() / 4);
                buf.extend_from_slice(oids);
            }
            BackendMessage::CopyInResponse(format)
            | BackendMessage::CopyOutResponse(format)
            | BackendMessage::CopyBothResponse(format) => {
                buf.push(format.format);
                format.column_formats.write(buf);
            }
            BackendMessage::DataRow(values) => {
                put_count16(buf, values.len());
                buf.extend_from_slice(values.raw());
            }
            BackendMessage::ErrorResponse(fields) | BackendMessage::NoticeResponse(fields) => {
                buf.extend_from_slice(fields.raw);
                buf.push(0);
            }
            BackendMessage::FunctionCallResponse(value) => put_nullable(buf, *value),
            BackendMessage::NegotiateProtocolVersion { newest_minor, unrecognized } => {
                put_i32(buf, *newest_minor);
                put_i32(buf, unrecognized.count as i32);
                buf.extend_from_slice(unrecognized.raw);
            }
            BackendMessage::NotificationResponse { process_id, channel, payload } => {
                put_i32(buf, *process_id);
                put_cstr(buf, channel);
                put_cstr(buf, payload);
            }
            BackendMessage::ParameterStatus { name, value } => {
                put_cstr(buf, name);
                put_cstr(buf, value);
            }
            BackendMessage::ReadyForQuery(status) => buf.push(status.byte()),
            BackendMessage::RowDescription { field_count, raw } => {
                put_count16(buf, *field_count);
                buf.extend_from_slice(raw);
            }
            BackendMessage::BindComplete
            | BackendMessage::CloseComplete
            | BackendMessage::CopyDone
            | BackendMessage::EmptyQueryResponse
            | BackendMessage::NoData
            | BackendMessage::ParseComplete
            | BackendMessage::PortalSuspended => {}
        }
    }
}

fn take_rest<'a>(reader: &mut FieldReader<'a>) -> &'a [u8] {
    let rest = reader.remaining();
    reader.take(rest.len(), "rest").expect("taking what remains cannot fail")
}

fn decode_authentication<'a>(reader: &mut FieldReader<'a>) -> WireResult<Authentication<'a>> {
    let code = reader.i32("authentication code")?;
    Ok(match code {
        0 => Authentication::Ok,
        3 => Authentication::CleartextPassword,
        5 => {
            let salt = reader.take(4, "salt")?;
            Authentication::Md5Password { salt: [salt[0], salt[1], salt[2], salt[3]] }
        }
        10 => {
            let list = take_rest(reader);
            if list.last() != Some(&0) {
                return Err(reader.bad("mechanism list"));
            }
            Authentication::Sasl { mechanisms: &list[..list.len() - 1] }
        }
        11 => Authentication::SaslContinue(take_rest(reader)),
        12 => Authentication::SaslFinal(take_rest(reader)),
        2 | 6 | 7 | 8 | 9 => Authentication::Unsupported { code, data: take_rest(reader) },
        _ => return Err(reader.bad("authentication code")),
    })
}

fn encode_authentication(buf: &mut Vec<u8>, auth: &Authentication<'_>) {
    match auth {
        Authentication::Ok => put_i32(buf, 0),
        Authentication::CleartextPassword => put_i32(buf, 3),
        Authentication::Md5Password { salt } => {
            put_i32(buf, 5);
            buf.extend_from_slice(salt);
        }
        Authentication::Sasl { mechanisms } => {
            put_i32(buf, 10);
            buf.extend_from_slice(mechanisms);
            buf.push(0);
        }
        Authentication::SaslContinue(data) => {
            put_i32(buf, 11);
            buf.extend_from_slice(data);
        }
        Authentication::SaslFinal(data) => {
            put_i32(buf, 12);
            buf.extend_from_slice(data);
        }
        Authentication::Unsupported { code, data } => {
            put_i32(buf, *code);
            buf.extend_from_slice(data);
        }
    }
}

fn decode_key_data<'a>(reader: &mut FieldReader<'a>) -> WireResult<BackendMessage<'a>> {
    let process_id = reader.i32("process id")?;
    let secret_key = take_rest(reader);
    if !(4..=256).contains(&secret_key.len()) {
        return Err(reader.bad("secret key length"));
    }
    Ok(BackendMessage::BackendKeyData { process_id, secret_key })
}

fn decode_copy_format<'a>(reader: &mut FieldReader<'a>) -> WireResult<CopyFormat<'a>> {
    let format = reader.u8("format")?;
    if format > 1 {
        return Err(reader.bad("format"));
    }
    Ok(CopyFormat { format, column_formats: Int16List::read(reader, "column formats")? })
}

fn decode_values<'a>(reader: &mut FieldReader<'a>) -> WireResult<ValueList<'a>> {
    let count = reader.count16("column count")?;
    ValueList::read_counted(reader, count, "column value")
}

fn decode_fields<'a>(reader: &mut FieldReader<'a>) -> WireResult<Fields<'a>> {
    let start = reader.remaining();
    loop {
        if reader.u8("field code")? == 0 {
            break;
        }
        reader.cstr("field value")?;
    }
    let used = start.len() - reader.remaining().len();
    Ok(Fields { raw: &start[..used - 1] })
}

fn decode_negotiate<'a>(reader: &mut FieldReader<'a>) -> WireResult<BackendMessage<'a>> {
    let newest_minor = reader.i32("newest minor version")?;
    let count = usize::try_from(reader.i32("option count")?).map_err(|_| reader.bad("option count"))?;
    let start = reader.remaining();
    for _ in 0..count {
        reader.cstr("option name")?;
    }
    let raw = &start[..start.len() - reader.remaining().len()];
    Ok(BackendMessage::NegotiateProtocolVersion { newest_minor, unrecognized: ValueListOfStrings { count, raw } })
}

fn decode_notification<'a>(reader: &mut FieldReader<'a>) -> WireResult<BackendMessage<'a>> {
    Ok(BackendMessage::NotificationResponse {
        process_id: reader.i32("process id")?,
        channel: reader.cstr("channel")?,
        payload: reader.cstr("payload")?,
    })
}

fn decode_oids<'a>(reader: &mut FieldReader<'a>) -> WireResult<&'a [u8]> {
    let count = reader.count16("parameter count")?;
    reader.take(count * 4, "parameter types")
}

fn decode_status(reader: &mut FieldReader<'_>) -> WireResult<TransactionStatus> {
    let byte = reader.u8("transaction status")?;
    TransactionStatus::from_byte(byte).ok_or_else(|| reader.bad("transaction status"))
}

/// Bytes of each RowDescription field after its name.
const FIELD_FIXED_LEN: usize = 18;

fn decode_row_description<'a>(reader: &mut FieldReader<'a>) -> WireResult<BackendMessage<'a>> {
    let field_count = reader.count16("field count")?;
    let start = reader.remaining();
    for _ in 0..field_count {
        reader.cstr("field name")?;
        reader.take(FIELD_FIXED_LEN, "field attributes")?;
    }
    let raw = &start[..start.len() - reader.remaining().len()];
    Ok(BackendMessage::RowDescription { field_count, raw })
}

/// Builders for messages a relay composes itself.
pub mod build {
    use super::*;

    /// An ErrorResponse or NoticeResponse with severity, SQLSTATE and message.
    pub fn error(buf: &mut Vec<u8>, severity: Severity, code: SqlState, text: &str) {
        notice_or_error(buf, tag::backend::ERROR_RESPONSE, severity, code.code(), text);
    }

    /// An ErrorResponse whose SQLSTATE came from elsewhere as text (a server's own error).
    pub fn error_with_code(buf: &mut Vec<u8>, severity: Severity, code: &str, text: &str) {
        notice_or_error(buf, tag::backend::ERROR_RESPONSE, severity, code, text);
    }

    pub fn notice(buf: &mut Vec<u8>, code: SqlState, text: &str) {
        notice_or_error(buf, tag::backend::NOTICE_RESPONSE, Severity::Notice, code.code(), text);
    }

    /// A NoticeResponse with another severity (WARNING, INFO, …).
    pub fn notice_with_severity(buf: &mut Vec<u8>, severity: Severity, code: SqlState, text: &str) {
        notice_or_error(buf, tag::backend::NOTICE_RESPONSE, severity, code.code(), text);
    }

    fn notice_or_error(buf: &mut Vec<u8>, tag: u8, severity: Severity, code: &str, text: &str) {
        message(buf, Some(tag), |buf| {
            for field in [tag::field::SEVERITY, tag::field::SEVERITY_NONLOCALIZED] {
                buf.push(field);
                put_cstr(buf, severity.name().as_bytes());
            }
            buf.push(tag::field::CODE);
            put_cstr(buf, code.as_bytes());
            buf.push(tag::field::MESSAGE);
            put_cstr(buf, text.as_bytes());
            buf.push(0);
        });
    }

    pub fn ready_for_query(buf: &mut Vec<u8>, status: TransactionStatus) {
        BackendMessage::ReadyForQuery(status).encode(buf);
    }

    pub fn parameter_status(buf: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        BackendMessage::ParameterStatus { name, value }.encode(buf);
    }

    pub fn authentication(buf: &mut Vec<u8>, auth: &Authentication<'_>) {
        BackendMessage::Authentication(auth.clone()).encode(buf);
    }

    pub fn backend_key_data(buf: &mut Vec<u8>, process_id: i32, secret_key: &[u8]) {
        BackendMessage::BackendKeyData { process_id, secret_key }.encode(buf);
    }

    pub fn command_complete(buf: &mut Vec<u8>, tag: &str) {
        BackendMessage::CommandComplete(tag.as_bytes()).encode(buf);
    }

    /// A RowDescription of text columns of type `text` (OID 25).
    pub fn text_row_description(buf: &mut Vec<u8>, names: &[&str]) {
        message(buf, Some(tag::backend::ROW_DESCRIPTION), |buf| {
            put_count16(buf, names.len());
            for name in names {
                put_cstr(buf, name.as_bytes());
                put_i32(buf, 0); // table OID
                put_i16(buf, 0); // column number
                put_i32(buf, 25); // type OID: text
                put_i16(buf, -1); // type size: variable
                put_i32(buf, -1); // type modifier
                put_i16(buf, 0); // format: text
            }
        });
    }

    pub fn data_row(buf: &mut Vec<u8>, values: &[Option<&[u8]>]) {
        message(buf, Some(tag::backend::DATA_ROW), |buf| {
            put_count16(buf, values.len());
            for value in values {
                put_nullable(buf, *value);
            }
        });
    }
}

/// Severities the relay itself reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Fatal,
    Error,
    Notice,
    Warning,
}

impl Severity {
    pub fn name(self) -> &'static str {
        match self {
            Severity::Fatal => "FATAL",
            Severity::Error => "ERROR",
            Severity::Notice => "NOTICE",
            Severity::Warning => "WARNING",
        }
    }
}
