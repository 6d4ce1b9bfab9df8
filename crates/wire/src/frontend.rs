//! Messages a client sends after startup. Decoding borrows from the frame and never allocates;
//! variable-length lists stay as raw slices with their element counts validated up front.

use crate::error::{WireError, WireResult};
use crate::read::FieldReader;
use crate::tag;
use crate::write::{message, put_count16, put_cstr, put_i16, put_i32, put_nullable};

/// A client message. `'p'` (password, SASL initial and continuation responses) depends on the
/// authentication state, so it is kept raw; see [`crate::auth_messages`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontendMessage<'a> {
    Bind(Bind<'a>),
    Close { kind: DescribeKind, name: &'a [u8] },
    CopyData(&'a [u8]),
    CopyDone,
    CopyFail(&'a [u8]),
    Describe { kind: DescribeKind, name: &'a [u8] },
    Execute { portal: &'a [u8], max_rows: i32 },
    Flush,
    FunctionCall(FunctionCall<'a>),
    Parse(Parse<'a>),
    PasswordLike(&'a [u8]),
    Query(&'a [u8]),
    Sync,
    Terminate,
}

/// Whether Describe or Close names a prepared statement or a portal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescribeKind {
    Statement,
    Portal,
}

impl DescribeKind {
    fn from_byte(byte: u8, reader: &FieldReader<'_>) -> WireResult<Self> {
        match byte {
            tag::status::STATEMENT => Ok(DescribeKind::Statement),
            tag::status::PORTAL => Ok(DescribeKind::Portal),
            _ => Err(reader.bad("target kind")),
        }
    }

    pub fn byte(self) -> u8 {
        match self {
            DescribeKind::Statement => tag::status::STATEMENT,
            DescribeKind::Portal => tag::status::PORTAL,
        }
    }
}

/// An Int16-counted list of Int16 values (format codes), kept raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int16List<'a> {
    raw: &'a [u8],
}

impl<'a> Int16List<'a> {
    pub(crate) fn read(reader: &mut FieldReader<'a>, field: &'static str) -> WireResult<Self> {
        let count = reader.count16(field)?;
        Ok(Int16List { raw: reader.take(count * 2, field)? })
    }

    pub fn len(&self) -> usize {
        self.raw.len() / 2
    }

    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = i16> + 'a {
        self.raw.chunks_exact(2).map(|pair| i16::from_be_bytes([pair[0], pair[1]]))
    }

    pub(crate) fn write(&self, buf: &mut Vec<u8>) {
        put_count16(buf, self.len());
        buf.extend_from_slice(self.raw);
    }
}

/// An Int16-counted list of length-prefixed nullable values, kept raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueList<'a> {
    count: usize,
    raw: &'a [u8],
}

impl<'a> ValueList<'a> {
    fn read(reader: &mut FieldReader<'a>, field: &'static str) -> WireResult<Self> {
        let count = reader.count16(field)?;
        Self::read_counted(reader, count, field)
    }

    /// Validates `count` values at the reader's position and keeps their bytes.
    pub(crate) fn read_counted(reader: &mut FieldReader<'a>, count: usize, field: &'static str) -> WireResult<Self> {
        let start = reader.remaining();
        for _ in 0..count {
            reader.nullable_bytes(field)?;
        }
        let used = start.len() - reader.remaining().len();
        Ok(ValueList { count, raw: &start[..used] })
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = Option<&'a [u8]>> + 'a {
        let mut reader = FieldReader::new(0, self.raw);
        (0..self.count).map(move |_| reader.nullable_bytes("value").expect("validated when decoded"))
    }

    pub(crate) fn raw(&self) -> &'a [u8] {
        self.raw
    }

    fn write(&self, buf: &mut Vec<u8>) {
        put_count16(buf, self.count);
        buf.extend_from_slice(self.raw);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind<'a> {
    pub portal: &'a [u8],
    pub statement: &'a [u8],
    pub param_formats: Int16List<'a>,
    pub params: ValueList<'a>,
    pub result_formats: Int16List<'a>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parse<'a> {
    pub name: &'a [u8],
    pub query: &'a [u8],
    /// Parameter type OIDs as raw Int32s.
    param_types_raw: &'a [u8],
}

impl<'a> Parse<'a> {
    pub fn new(name: &'a [u8], query: &'a [u8]) -> Self {
        Parse { name, query, param_types_raw: &[] }
    }

    pub fn param_types(&self) -> impl Iterator<Item = u32> + 'a {
        self.param_types_raw.chunks_exact(4).map(|oid| u32::from_be_bytes([oid[0], oid[1], oid[2], oid[3]]))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionCall<'a> {
    pub function_oid: u32,
    pub arg_formats: Int16List<'a>,
    pub args: ValueList<'a>,
    pub result_format: i16,
}

impl<'a> FrontendMessage<'a> {
    /// Decodes a message body; `tag` is its type byte.
    pub fn decode(tag: u8, body: &'a [u8]) -> WireResult<Self> {
        let mut reader = FieldReader::new(tag, body);
        let message = match tag {
            tag::frontend::BIND => FrontendMessage::Bind(decode_bind(&mut reader)?),
            tag::frontend::CLOSE => {
                FrontendMessage::Close { kind: read_kind(&mut reader)?, name: reader.cstr("name")? }
            }
            tag::frontend::COPY_DATA => FrontendMessage::CopyData(take_rest(&mut reader)),
            tag::frontend::COPY_DONE => FrontendMessage::CopyDone,
            tag::frontend::COPY_FAIL => FrontendMessage::CopyFail(reader.cstr("error message")?),
            tag::frontend::DESCRIBE => {
                FrontendMessage::Describe { kind: read_kind(&mut reader)?, name: reader.cstr("name")? }
            }
            tag::frontend::EXECUTE => {
                FrontendMessage::Execute { portal: reader.cstr("portal")?, max_rows: reader.i32("row limit")? }
            }
            tag::frontend::FLUSH => FrontendMessage::Flush,
            tag::frontend::FUNCTION_CALL => FrontendMessage::FunctionCall(decode_function_call(&mut reader)?),
            tag::frontend::PARSE => FrontendMessage::Parse(decode_parse(&mut reader)?),
            tag::frontend::PASSWORD => FrontendMessage::PasswordLike(take_rest(&mut reader)),
            tag::frontend::QUERY => FrontendMessage::Query(reader.cstr("query")?),
            tag::frontend::SYNC => FrontendMessage::Sync,
            tag::frontend::TERMINATE => FrontendMessage::Terminate,
            _ => return Err(WireError::UnknownTag(tag as char)),
        };
        reader.finish()?;
        Ok(message)
    }

    /// The type byte of this message.
    pub fn tag(&self) -> u8 {
        match self {
            FrontendMessage::Bind(_) => tag::frontend::BIND,
            FrontendMessage::Close { .. } => tag::frontend::CLOSE,
            FrontendMessage::CopyData(_) => tag::frontend::COPY_DATA,
            FrontendMessage::CopyDone => tag::frontend::COPY_DONE,
            FrontendMessage::CopyFail(_) => tag::frontend::COPY_FAIL,
            FrontendMessage::Describe { .. } => tag::frontend::DESCRIBE,
            FrontendMessage::Execute { .. } => tag::frontend::EXECUTE,
            FrontendMessage::Flush => tag::frontend::FLUSH,
            FrontendMessage::FunctionCall(_) => tag::frontend::FUNCTION_CALL,
            FrontendMessage::Parse(_) => tag::frontend::PARSE,
            FrontendMessage::PasswordLike(_) => tag::frontend::PASSWORD,
            FrontendMessage::Query(_) => tag::frontend::QUERY,
            FrontendMessage::Sync => tag::frontend::SYNC,
            FrontendMessage::Terminate => tag::frontend::TERMINATE,
        }
    }

    /// Appends the whole message, header included, to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        message(buf, Some(self.tag()), |buf| self.encode_body(buf));
    }

    fn encode_body(&self, buf: &mut Vec<u8>) {
        match self {
            FrontendMessage::Bind(bind) => encode_bind(buf, bind),
            FrontendMessage::Close { kind, name } | FrontendMessage::Describe { kind, name } => {
                buf.push(kind.byte());
                put_cstr(buf, name);
            }
            FrontendMessage::CopyData(data) | FrontendMessage::PasswordLike(data) => buf.extend_from_slice(data),
            FrontendMessage::CopyFail(text) | FrontendMessage::Query(text) => put_cstr(buf, text),
            FrontendMessage::Execute { portal, max_rows } => {
                put_cstr(buf, portal);
                put_i32(buf, *max_rows);
            }
            FrontendMessage::FunctionCall(call) => encode_function_call(buf, call),
            FrontendMessage::Parse(parse) => {
                put_cstr(buf, parse.name);
                put_cstr(buf, parse.query);
                put_count16(buf, parse.param_types_raw.len() / 4);
                buf.extend_from_slice(parse.param_types_raw);
            }
            FrontendMessage::CopyDone | FrontendMessage::Flush | FrontendMessage::Sync | FrontendMessage::Terminate => {
            }
        }
    }
}

fn take_rest<'a>(reader: &mut FieldReader<'a>) -> &'a [u8] {
    let rest = reader.remaining();
    reader.take(rest.len(), "rest").expect("taking what remains cannot fail")
}

fn read_kind(reader: &mut FieldReader<'_>) -> WireResult<DescribeKind> {
    let byte = reader.u8("target kind")?;
    DescribeKind::from_byte(byte, reader)
}

fn decode_bind<'a>(reader: &mut FieldReader<'a>) -> WireResult<Bind<'a>> {
    Ok(Bind {
        portal: reader.cstr("portal")?,
        statement: reader.cstr("statement")?,
        param_formats: Int16List::read(reader, "parameter formats")?,
        params: ValueList::read(reader, "parameters")?,
        result_formats: Int16List::read(reader, "result formats")?,
    })
}

fn encode_bind(buf: &mut Vec<u8>, bind: &Bind<'_>) {
    put_cstr(buf, bind.portal);
    put_cstr(buf, bind.statement);
    bind.param_formats.write(buf);
    bind.params.write(buf);
    bind.result_formats.write(buf);
}

fn decode_parse<'a>(reader: &mut FieldReader<'a>) -> WireResult<Parse<'a>> {
    let name = reader.cstr("statement")?;
    let query = reader.cstr("query")?;
    let count = reader.count16("parameter types")?;
    let param_types_raw = reader.take(count * 4, "parameter types")?;
    Ok(Parse { name, query, param_types_raw })
}

fn decode_function_call<'a>(reader: &mut FieldReader<'a>) -> WireResult<FunctionCall<'a>> {
    Ok(FunctionCall {
        function_oid: reader.i32("function oid")? as u32,
        arg_formats: Int16List::read(reader, "argument formats")?,
        args: ValueList::read(reader, "arguments")?,
        result_format: reader.i16("result format")?,
    })
}

fn encode_function_call(buf: &mut Vec<u8>, call: &FunctionCall<'_>) {
    put_i32(buf, call.function_oid as i32);
    call.arg_formats.write(buf);
    call.args.write(buf);
    put_i16(buf, call.result_format);
}

/// Builders for messages a client or a relay composes from parts (tests, the pooler's own queries).
pub mod build {
    use super::*;

    pub fn query(buf: &mut Vec<u8>, sql: &str) {
        FrontendMessage::Query(sql.as_bytes()).encode(buf);
    }

    pub fn parse(buf: &mut Vec<u8>, name: &str, sql: &str, param_types: &[u32]) {
        message(buf, Some(tag::frontend::PARSE), |buf| {
            put_cstr(buf, name.as_bytes());
            put_cstr(buf, sql.as_bytes());
            put_count16(buf, param_types.len());
            for oid in param_types {
                put_i32(buf, *oid as i32);
            }
        });
    }

    /// Bind with text-format parameters and results.
    pub fn bind(buf: &mut Vec<u8>, portal: &str, statement: &str, params: &[Option<&[u8]>]) {
        message(buf, Some(tag::frontend::BIND), |buf| {
            put_cstr(buf, portal.as_bytes());
            put_cstr(buf, statement.as_bytes());
            put_count16(buf, 0);
            put_count16(buf, params.len());
            for value in params {
                put_nullable(buf, *value);
            }
            put_count16(buf, 0);
        });
    }

    pub fn sync(buf: &mut Vec<u8>) {
        FrontendMessage::Sync.encode(buf);
    }

    pub fn terminate(buf: &mut Vec<u8>) {
        FrontendMessage::Terminate.encode(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_with_parameters_round_trips() {
        let mut buf = Vec::new();
        build::bind(&mut buf, "", "s1", &[Some(b"42"), None]);
        let message = FrontendMessage::decode(b'B', &buf[5..]).expect("valid bind");
        let FrontendMessage::Bind(bind) = &message else { panic!("not a bind") };
        assert_eq!(bind.statement, b"s1");
        assert_eq!(bind.params.iter().collect::<Vec<_>>(), vec![Some(&b"42"[..]), None]);
        let mut again = Vec::new();
        message.encode(&mut again);
        assert_eq!(again, buf);
    }

    #[test]
    fn malformed_bodies_are_typed_errors() {
        assert!(matches!(FrontendMessage::decode(b'Q', b"select 1"), Err(WireError::Truncated { .. })));
        assert!(matches!(FrontendMessage::decode(b'S', b"x"), Err(WireError::TrailingBytes { .. })));
        assert!(matches!(FrontendMessage::decode(b'D', b"Xname\0"), Err(WireError::BadField { .. })));
        assert!(matches!(FrontendMessage::decode(b'B', b"\0\0\xff\xff"), Err(WireError::BadField { .. })));
        assert_eq!(FrontendMessage::decode(b'!', b""), Err(WireError::UnknownTag('!')));
    }
}
