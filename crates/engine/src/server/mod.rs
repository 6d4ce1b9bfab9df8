//! `bypass engine serve`: the PostgreSQL protocol (simple and extended query) over the engine,
//! a thin adapter around the `pgwire` crate.
//!
//! ```text
//!   client ─TCP─► network thread (current-thread Tokio runtime, pgwire state machine)
//!                    └─ spawn_blocking(engine.execute) ─► morsel workers (pinned) ─► rows
//!                 ◄─ RowDescription / DataRow (text or binary) / CommandComplete / ErrorResponse
//! ```
//!
//! Invariants: compute never runs on the network thread; every engine error becomes an
//! ErrorResponse with its SQLSTATE (0A000 names the unsupported feature) and the connection
//! stays usable; parameters ($1 …) are substituted as SQL literals before parsing.

mod cell;
mod params;

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream;
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    DataRowEncoder, DescribePortalResponse, DescribeStatementResponse, FieldInfo, QueryResponse, Response, Tag,
};
use pgwire::api::stmt::{NoopQueryParser, StoredStatement};
use pgwire::api::{ClientInfo, PgWireServerHandlers, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use tokio::net::TcpListener;

use crate::engine::{Engine, QueryResult};
use crate::error::EngineError;
use crate::types::DataType;
use cell::Cell;

/// Connections served at once; further ones wait in the listen backlog.
pub const CONNECTIONS_MAX: usize = 256;

/// The pgwire handlers: one per server, shared by all connections.
pub struct Handler {
    engine: Arc<Engine>,
    parser: Arc<NoopQueryParser>,
}

impl NoopStartupHandler for Handler {}

struct Handlers(Arc<Handler>);

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        Arc::clone(&self.0)
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        Arc::clone(&self.0)
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        Arc::clone(&self.0)
    }
}

fn error_info(error: &EngineError) -> ErrorInfo {
    // Protocol fields are NUL-terminated: a NUL inside the text would corrupt the message.
    let message = error.to_string().replace('\0', "\\0");
    ErrorInfo::new("ERROR".to_string(), error.sqlstate().to_string(), message)
}

fn pg_type(data_type: DataType) -> Type {
    match data_type {
        DataType::Bool => Type::BOOL,
        DataType::Int32 => Type::INT4,
        DataType::Int64 => Type::INT8,
        DataType::Float64 => Type::FLOAT8,
        DataType::Date => Type::DATE,
        DataType::Decimal { .. } | DataType::Numeric => Type::NUMERIC,
        DataType::Text => Type::TEXT,
    }
}

fn fields(names: &[String], types: &[DataType], format: &Format) -> Vec<FieldInfo> {
    names
        .iter()
        .zip(types)
        .enumerate()
        .map(|(i, (name, t))| FieldInfo::new(name.clone(), None, None, pg_type(*t), format.format_for(i)))
        .collect()
}

/// Turns a statement result into a pgwire response with rows encoded in `format`.
fn response(result: QueryResult, format: &Format) -> PgWireResult<Response> {
    if !result.returns_rows {
        let mut parts = result.tag.rsplitn(2, ' ');
        let last = parts.next().unwrap_or_default();
        return Ok(Response::Execution(match (last.parse::<usize>(), parts.next()) {
            (Ok(rows), Some(command)) => Tag::new(command).with_rows(rows),
            _ => Tag::new(&result.tag),
        }));
    }
    let schema = Arc::new(fields(&result.names, &result.types, format));
    let mut encoder = DataRowEncoder::new(Arc::clone(&schema));
    let mut rows = Vec::with_capacity(result.row_count());
    for batch in &result.batches {
        for row in 0..batch.rows {
            for column in &batch.columns {
                encoder.encode_field(&Cell(column.value(row)))?;
            }
            rows.push(Ok(encoder.take_row()));
        }
    }
    let mut response = QueryResponse::new(schema, stream::iter(rows));
    response.set_command_tag("SELECT");
    Ok(Response::Query(response))
}

impl Handler {
    /// The portal's SQL with its parameters as literals (types the client left open are
    /// inferred by describing the statement).
    fn bind_parameters(&self, portal: &Portal<String>) -> PgWireResult<String> {
        let sql = &portal.statement.statement;
        let inferred = if portal.parameter_len() > 0 {
            self.engine.describe_with_parameters(&params::with_sentinels(sql)).map(|(_, t)| t).unwrap_or_default()
        } else {
            Default::default()
        };
        params::substitute(sql, portal, &|n| inferred.get(&n).map(|t| pg_type(*t))).map_err(user_error)
    }

    async fn run(&self, sql: String) -> Result<Vec<QueryResult>, EngineError> {
        let engine = Arc::clone(&self.engine);
        tokio::task::spawn_blocking(move || engine.execute(&sql))
            .await
            .map_err(|e| EngineError::Runtime(format!("query task failed: {e}")))?
    }
}

#[async_trait]
impl SimpleQueryHandler for Handler {
    async fn do_query<C>(&self, _client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        if query.trim().trim_end_matches(';').trim().is_empty() {
            return Ok(vec![Response::EmptyQuery]);
        }
        match self.run(query.to_string()).await {
            Ok(results) => results.into_iter().map(|r| response(r, &Format::UnifiedText)).collect(),
            Err(error) => Ok(vec![Response::Error(Box::new(error_info(&error)))]),
        }
    }
}

#[async_trait]
impl ExtendedQueryHandler for Handler {
    type Statement = String;
    type QueryParser = NoopQueryParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        Arc::clone(&self.parser)
    }

    async fn do_query<C>(&self, _client: &mut C, portal: &Portal<String>, _max_rows: usize) -> PgWireResult<Response>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let sql = self.bind_parameters(portal)?;
        if sql.trim().is_empty() {
            return Ok(Response::EmptyQuery);
        }
        let mut results = self.run(sql).await.map_err(user_error)?;
        match results.pop() {
            Some(result) => response(result, &portal.result_column_format),
            None => Ok(Response::EmptyQuery),
        }
    }

    async fn do_describe_statement<C>(
        &self,
        _client: &mut C,
        statement: &StoredStatement<String>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let count = params::placeholder_count(&statement.statement);
        let sql = params::with_sentinels(&statement.statement);
        let (described, inferred) = self.engine.describe_with_parameters(&sql).map_err(user_error)?;
        let parameter_types = (0..count)
            .map(|i| {
                let declared = statement.parameter_types.get(i).cloned().flatten();
                declared.unwrap_or_else(|| inferred.get(&(i + 1)).map_or(Type::TEXT, |t| pg_type(*t)))
            })
            .collect();
        let fields = described.map_or_else(Vec::new, |(names, types)| fields(&names, &types, &Format::UnifiedBinary));
        Ok(DescribeStatementResponse::new(parameter_types, fields))
    }

    async fn do_describe_portal<C>(
        &self,
        _client: &mut C,
        portal: &Portal<String>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let sql = self.bind_parameters(portal)?;
        let described = self.engine.describe(&sql).map_err(user_error)?;
        let fields =
            described.map_or_else(Vec::new, |(names, types)| fields(&names, &types, &portal.result_column_format));
        Ok(DescribePortalResponse::new(fields))
    }
}

fn user_error(error: EngineError) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(&error)))
}

/// A running server: its address, and a handle that stops it when dropped.
pub struct Server {
    pub address: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            // The receiver may be gone already when the accept loop failed: nothing to stop.
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Starts serving on `address` (port 0 = any free port) on a separate network thread.
pub fn start(engine: Arc<Engine>, address: SocketAddr) -> Result<Server, EngineError> {
    let listener =
        std::net::TcpListener::bind(address).map_err(|e| EngineError::io(format!("binding {address}"), e))?;
    listener.set_nonblocking(true).map_err(|e| EngineError::io("configuring the listener", e))?;
    let address = listener.local_addr().map_err(|e| EngineError::io("reading the listen address", e))?;
    let (shutdown, stopped) = tokio::sync::oneshot::channel();
    let handler = Arc::new(Handler { engine, parser: Arc::new(NoopQueryParser::new()) });
    let thread = std::thread::Builder::new()
        .name("engine-network".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            match runtime {
                Ok(runtime) => runtime.block_on(accept_loop(listener, handler, stopped)),
                Err(error) => eprintln!("engine server: cannot start the network runtime: {error}"),
            }
        })
        .map_err(|e| EngineError::io("spawning the network thread", e))?;
    Ok(Server { address, shutdown: Some(shutdown), thread: Some(thread) })
}

async fn accept_loop(
    listener: std::net::TcpListener,
    handler: Arc<Handler>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("engine server: {error}");
            return;
        }
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    loop {
        let accepted = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((socket, _)) = accepted else { continue };
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else { return };
        let handlers = Handlers(Arc::clone(&handler));
        tokio::spawn(async move {
            // A client that disconnects mid-message is that client's problem, not the server's.
            let _ = pgwire::tokio::process_socket(socket, None, handlers).await;
            drop(permit);
        });
    }
}
