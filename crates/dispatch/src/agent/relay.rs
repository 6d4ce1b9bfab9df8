//! One link's life after login: relay requests to PostgreSQL and answers back, and carry out the
//! hand-over conversation when the dispatcher asks for it.

use bypass_wire::frame::{Scanner, Step};
use bypass_wire::DEFAULT_MESSAGE_SIZE_MAX;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::LINK_BUFFER_BYTES;
use crate::buffer::{closed, Buffer};
use crate::config::ValidAgentConfig;
use crate::error::{DispatchError, Result};
use crate::link::{Control, Delivery, CONTROL_TAG};

/// The state of one link.
pub struct LinkSession<'a> {
    #[allow(dead_code)]
    config: &'a ValidAgentConfig,
    link: TcpStream,
    /// Bytes from the dispatcher.
    down: Buffer,
    down_scanner: Scanner,
    postgres: TcpStream,
    /// Bytes from PostgreSQL.
    up: Buffer,
    up_scanner: Scanner,
    delivery: Delivery,
    threshold: u64,
    /// Answer bytes of the current request sent so far.
    answer_bytes: u64,
}

impl<'a> LinkSession<'a> {
    pub fn new(config: &'a ValidAgentConfig, link: TcpStream, down: Buffer, postgres: TcpStream) -> Self {
        LinkSession {
            config,
            link,
            down,
            down_scanner: Scanner::new(),
            postgres,
            up: Buffer::with_capacity(LINK_BUFFER_BYTES),
            up_scanner: Scanner::new(),
            delivery: Delivery::Relay,
            threshold: u64::MAX,
            answer_bytes: 0,
        }
    }

    /// Relays until either side closes.
    pub async fn run(mut self) -> Result<()> {
        // Bytes that arrived together with the startup packet.
        self.process_down().await?;
        loop {
            tokio::select! {
                ready = self.link.readable() => {
                    ready.map_err(|e| DispatchError::io("waiting on the link", e))?;
                    match self.down.try_read_from(&self.link).map_err(|e| DispatchError::io("reading the link", e))? {
                        Some(0) => return Ok(()),
                        Some(_) => self.process_down().await?,
                        None => {}
                    }
                }
                ready = self.postgres.readable() => {
                    ready.map_err(|e| DispatchError::io("waiting on PostgreSQL", e))?;
                    match self.up.try_read_from(&self.postgres).map_err(|e| DispatchError::io("reading PostgreSQL", e))? {
                        Some(0) => return Err(closed("PostgreSQL")),
                        Some(_) => self.process_up().await?,
                        None => {}
                    }
                }
            }
        }
    }

    /// Forwards the dispatcher's PostgreSQL messages and acts on control frames.
    async fn process_down(&mut self) -> Result<()> {
        loop {
            let mut forward = 0;
            let mut control = None;
            loop {
                let pending = &self.down.pending()[forward..];
                match self.down_scanner.next(pending, self.down.capacity(), DEFAULT_MESSAGE_SIZE_MAX)? {
                    Step::Message(header) if header.tag == CONTROL_TAG => {
                        control = Some(header);
                        break;
                    }
                    Step::Message(header) => forward += header.frame_len(),
                    Step::LargeStart { chunk_len, .. } | Step::Continuation { chunk_len, .. } => forward += chunk_len,
                    Step::NeedMore => break,
                }
            }
            if forward > 0 {
                self.postgres
                    .write_all(&self.down.pending()[..forward])
                    .await
                    .map_err(|e| DispatchError::io("writing to PostgreSQL", e))?;
                self.down.consume(forward);
            }
            let Some(header) = control else { return Ok(()) };
            let frame_len = header.frame_len();
            let body = self.down.pending()[bypass_wire::HEADER_LEN..frame_len].to_vec();
            self.down.consume(frame_len);
            self.on_control(&body)?;
        }
    }

    fn on_control(&mut self, body: &[u8]) -> Result<()> {
        match Control::decode(body)? {
            Control::Request { delivery, threshold } => {
                self.delivery = delivery;
                self.threshold = threshold;
                self.answer_bytes = 0;
                Ok(())
            }
            other => Err(DispatchError::Protocol(format!("unexpected control frame from the dispatcher: {other:?}"))),
        }
    }

    /// Sends PostgreSQL's answer bytes on their way.
    async fn process_up(&mut self) -> Result<()> {
        let mut forward = 0;
        loop {
            let pending = &self.up.pending()[forward..];
            match self.up_scanner.next(pending, self.up.capacity(), DEFAULT_MESSAGE_SIZE_MAX)? {
                Step::Message(header) => {
                    forward += header.frame_len();
                    if header.tag == b'Z' {
                        self.answer_bytes = 0;
                    }
                }
                Step::LargeStart { chunk_len, .. } | Step::Continuation { chunk_len, .. } => forward += chunk_len,
                Step::NeedMore => break,
            }
        }
        if forward > 0 {
            self.link
                .write_all(&self.up.pending()[..forward])
                .await
                .map_err(|e| DispatchError::io("writing to the dispatcher", e))?;
            self.answer_bytes += forward as u64;
            self.up.consume(forward);
        }
        Ok(())
    }
}
