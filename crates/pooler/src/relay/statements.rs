//! Client requests on a transaction-mode link, with the pooler owning prepared statements (see
//! [`crate::prepared`]): named Parse, Bind, Describe and Close are rewritten to server names, a
//! statement the server lacks is prepared first, and every request is entered in the link's
//! [`ResponsePlan`] so the answers can be matched.

use std::ops::Range;

use bypass_wire::frontend::{Bind, DescribeKind};
use bypass_wire::tag;
use bypass_wire::{FrontendMessage, SqlState, HEADER_LEN};

use super::outgoing::Outgoing;
use crate::error::PoolerError;
use crate::prepared::{
    encode_close_statement, server_name, unit_for, ClientStatements, ResponsePlan, ServerStatements, Statement,
    StatementRegistry, SyntheticAnswer, Unit,
};

/// What a link needs to rewrite client requests.
pub struct Statements<'a> {
    pub registry: &'a StatementRegistry,
    pub client: &'a mut ClientStatements,
    pub server: &'a mut ServerStatements,
    pub plan: &'a mut ResponsePlan,
}

fn limit(what: &str) -> PoolerError {
    PoolerError::refused(SqlState::PROGRAM_LIMIT_EXCEEDED, format!("too many {what} for transaction pooling"))
}

impl Statements<'_> {
    fn expect(&mut self, unit: Unit) -> Result<(), PoolerError> {
        if self.plan.push(unit) {
            Ok(())
        } else {
            Err(limit("requests in flight"))
        }
    }

    /// Handles one whole client message, `frame` at `range` of the source.
    pub fn message(&mut self, out: &mut Outgoing<'_>, frame: &[u8], range: Range<usize>) -> Result<(), PoolerError> {
        let tag = frame[0];
        if self.plan.skipping()
            || !matches!(
                tag,
                tag::frontend::PARSE
                    | tag::frontend::BIND
                    | tag::frontend::DESCRIBE
                    | tag::frontend::CLOSE
                    | tag::frontend::QUERY
            )
        {
            // After an error the server ignores everything up to Sync: pass it as sent.
            return self.pass(out, frame, range);
        }
        let message = FrontendMessage::decode(tag, &frame[HEADER_LEN..]).map_err(PoolerError::ClientProtocol)?;
        match message {
            FrontendMessage::Parse(parse) if !parse.name.is_empty() => {
                let types: Vec<u32> = parse.param_types().collect();
                let statement =
                    self.registry.intern(parse.query, &types).ok_or_else(|| limit("distinct statements"))?;
                self.parse(out, parse.name, statement)
            }
            FrontendMessage::Bind(bind) if !bind.statement.is_empty() => match self.client.get(bind.statement).cloned()
            {
                Some(statement) => self.bind(out, &bind, &statement),
                None => self.pass(out, frame, range),
            },
            FrontendMessage::Describe { kind: DescribeKind::Statement, name } if !name.is_empty() => {
                match self.client.get(name).cloned() {
                    Some(statement) => self.describe(out, &statement),
                    None => self.pass(out, frame, range),
                }
            }
            FrontendMessage::Close { kind: DescribeKind::Statement, name } if !name.is_empty() => {
                // Servers keep the statement for other clients; the client's name is gone.
                self.client.remove(name);
                out.drop_range(range);
                self.expect(Unit::Synthetic(SyntheticAnswer::CloseComplete))
            }
            FrontendMessage::Query(sql) => {
                self.query_side_effects(sql);
                self.pass(out, frame, range)
            }
            _ => self.pass(out, frame, range),
        }
    }

    /// Forwards a message unchanged and expects its usual answer.
    fn pass(&mut self, out: &mut Outgoing<'_>, frame: &[u8], range: Range<usize>) -> Result<(), PoolerError> {
        out.pass(range);
        let kind = (frame[0] == tag::frontend::DESCRIBE).then(|| frame.get(HEADER_LEN).copied()).flatten();
        let describe_kind =
            kind.map(|k| if k == tag::status::STATEMENT { DescribeKind::Statement } else { DescribeKind::Portal });
        match unit_for(frame[0], describe_kind) {
            Some(unit) => self.expect(unit),
            None => Ok(()),
        }
    }

    fn parse(
        &mut self,
        out: &mut Outgoing<'_>,
        name: &[u8],
        statement: std::sync::Arc<Statement>,
    ) -> Result<(), PoolerError> {
        if !self.client.insert(name, statement.clone()) {
            return Err(limit("prepared statements in one session"));
        }
        if self.server.touch(statement.id) {
            return self.expect(Unit::Synthetic(SyntheticAnswer::ParseComplete));
        }
        self.prepare(out, &statement, false)
    }

    /// Sends the statement's Parse (evicting the least recently used one if the server is full).
    fn prepare(&mut self, out: &mut Outgoing<'_>, statement: &Statement, hidden: bool) -> Result<(), PoolerError> {
        if let Some(evicted) = self.server.add(statement.id) {
            out.insert_with(|buf| encode_close_statement(buf, &server_name(evicted)));
            self.expect(Unit::Close { hidden: true })?;
        }
        out.insert(&statement.parse);
        self.expect(Unit::Parse { hidden, statement: Some(statement.id) })
    }

    /// Makes sure the server has the statement before a Bind too large for the buffer.
    pub fn ensure_for_large(&mut self, out: &mut Outgoing<'_>, statement: &Statement) -> Result<(), PoolerError> {
        self.ensure(out, statement)
    }

    pub fn expect_unit(&mut self, unit: Unit) -> Result<(), PoolerError> {
        self.expect(unit)
    }

    /// Forwards the first chunk of a large message unchanged and expects its answer.
    pub fn pass_large(&mut self, out: &mut Outgoing<'_>, tag: u8, range: Range<usize>) -> Result<(), PoolerError> {
        out.pass(range);
        match unit_for(tag, None) {
            Some(unit) => self.expect(unit),
            None => Ok(()),
        }
    }

    /// Makes sure the server has the statement, before a request that uses it.
    fn ensure(&mut self, out: &mut Outgoing<'_>, statement: &Statement) -> Result<(), PoolerError> {
        if self.server.touch(statement.id) {
            return Ok(());
        }
        self.prepare(out, statement, true)
    }

    fn bind(&mut self, out: &mut Outgoing<'_>, bind: &Bind<'_>, statement: &Statement) -> Result<(), PoolerError> {
        self.ensure(out, statement)?;
        let name = server_name(statement.id);
        let rewritten = Bind { statement: name.as_bytes(), ..bind.clone() };
        out.insert_with(|buf| FrontendMessage::Bind(rewritten).encode(buf));
        self.expect(Unit::Bind)
    }

    fn describe(&mut self, out: &mut Outgoing<'_>, statement: &Statement) -> Result<(), PoolerError> {
        self.ensure(out, statement)?;
        let name = server_name(statement.id);
        out.insert_with(|buf| {
            FrontendMessage::Describe { kind: DescribeKind::Statement, name: name.as_bytes() }.encode(buf)
        });
        self.expect(Unit::DescribeStatement)
    }

    /// `DISCARD ALL` and `DEALLOCATE ALL` drop every statement of the server (and the latter the
    /// client's names): the pooler must prepare them again where needed.
    fn query_side_effects(&mut self, sql: &[u8]) {
        let mut words = sql.split(|b| b.is_ascii_whitespace() || *b == b';').filter(|w| !w.is_empty());
        let (first, second) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
        let deallocate = first.eq_ignore_ascii_case(b"deallocate");
        if (deallocate || first.eq_ignore_ascii_case(b"discard")) && second.eq_ignore_ascii_case(b"all") {
            self.server.clear();
            if deallocate {
                self.client.clear();
            }
        }
    }
}

/// The start of a Bind too large for the buffer, with its statement name rewritten: returns how
/// many bytes of `chunk` were consumed into `out` (header, portal and name), the rest of the message
/// then passes unchanged. `None` if the names are not all in the chunk.
pub fn rewrite_large_bind_start(chunk: &[u8], length: u32, server_name: &str, out: &mut Vec<u8>) -> Option<usize> {
    let body = chunk.get(HEADER_LEN..)?;
    let portal_end = body.iter().position(|&b| b == 0)?;
    let statement_end = portal_end + 1 + body[portal_end + 1..].iter().position(|&b| b == 0)?;
    let old_name_len = statement_end - portal_end - 1;
    let new_length = i64::from(length) - old_name_len as i64 + server_name.len() as i64;
    let new_length = u32::try_from(new_length).ok()?;
    out.push(tag::frontend::BIND);
    out.extend_from_slice(&new_length.to_be_bytes());
    out.extend_from_slice(&body[..=portal_end]);
    out.extend_from_slice(server_name.as_bytes());
    out.push(0);
    Some(HEADER_LEN + statement_end + 1)
}

/// The statement name of a Bind whose start is in `chunk`.
pub fn large_bind_statement(chunk: &[u8]) -> Option<&[u8]> {
    let body = chunk.get(HEADER_LEN..)?;
    let portal_end = body.iter().position(|&b| b == 0)?;
    let rest = &body[portal_end + 1..];
    rest.iter().position(|&b| b == 0).map(|end| &rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_bind_prefix_keeps_the_length_consistent() {
        let mut bind = Vec::new();
        bypass_wire::frontend::build::bind(&mut bind, "", "s1", &[Some(&[7u8; 100][..])]);
        let length = u32::from_be_bytes([bind[1], bind[2], bind[3], bind[4]]);
        assert_eq!(large_bind_statement(&bind[..20]), Some(&b"s1"[..]));
        let mut out = Vec::new();
        let used = rewrite_large_bind_start(&bind[..20], length, "_bypass_p42", &mut out).expect("names fit");
        out.extend_from_slice(&bind[used..]);
        let new_length = u32::from_be_bytes([out[1], out[2], out[3], out[4]]) as usize;
        assert_eq!(new_length + 1, out.len());
        let decoded = FrontendMessage::decode(b'B', &out[HEADER_LEN..]).expect("valid bind");
        let FrontendMessage::Bind(rewritten) = decoded else { panic!("not a bind") };
        assert_eq!(rewritten.statement, b"_bypass_p42");
        assert_eq!(rewritten.params.iter().next(), Some(Some(&[7u8; 100][..])));
    }
}
