//! Transaction tracking for a linked client and server, without I/O: the session feeds it every
//! message header it forwards, and it answers whether the server may go back to the pool.
//!
//! A server is released only when its last ReadyForQuery said idle ('I') **and** every request
//! the client sent has been answered: Query, FunctionCall and Sync each get exactly one
//! ReadyForQuery. Messages of an extended-protocol batch not yet closed by Sync also hold the server.

use bypass_wire::tag;
use bypass_wire::TransactionStatus;

/// Request/response accounting for one link.
#[derive(Debug, Clone)]
pub struct TransactionTracker {
    /// Requests sent that have not yet had their ReadyForQuery.
    outstanding: u32,
    /// Extended-protocol messages sent since the last Sync.
    batch_open: bool,
    /// The server is in COPY FROM STDIN: the client's Syncs are ignored until CopyDone/CopyFail.
    copy_in: bool,
    /// Syncs sent since the last Execute or Query. If that request turns out to start COPY FROM
    /// STDIN, the server ignores them (drivers send Bind, Execute, Sync before any copy data).
    syncs_since_execute: u32,
    status: TransactionStatus,
}

impl Default for TransactionTracker {
    fn default() -> Self {
        TransactionTracker {
            outstanding: 0,
            batch_open: false,
            copy_in: false,
            syncs_since_execute: 0,
            status: TransactionStatus::Idle,
        }
    }
}

impl TransactionTracker {
    /// Accounts for a message the client sent to the server.
    pub fn client_message(&mut self, tag: u8) {
        match tag {
            tag::frontend::QUERY => {
                self.outstanding += 1;
                self.syncs_since_execute = 0;
            }
            tag::frontend::FUNCTION_CALL => self.outstanding += 1,
            tag::frontend::SYNC if self.copy_in => {}
            tag::frontend::SYNC => {
                self.outstanding += 1;
                self.syncs_since_execute += 1;
                self.batch_open = false;
            }
            tag::frontend::COPY_DONE | tag::frontend::COPY_FAIL => self.copy_in = false,
            tag::frontend::EXECUTE => {
                self.syncs_since_execute = 0;
                self.batch_open = true;
            }
            tag::frontend::PARSE
            | tag::frontend::BIND
            | tag::frontend::DESCRIBE
            | tag::frontend::CLOSE
            | tag::frontend::FLUSH => self.batch_open = true,
            _ => {}
        }
    }

    /// Accounts for a message the server sent; `status` is set for ReadyForQuery.
    pub fn server_message(&mut self, tag: u8, status: Option<TransactionStatus>) {
        match tag {
            tag::backend::READY_FOR_QUERY => {
                self.outstanding = self.outstanding.saturating_sub(1);
                self.status = status.unwrap_or(self.status);
                self.copy_in = false;
            }
            tag::backend::COPY_IN_RESPONSE => {
                self.copy_in = true;
                self.outstanding = self.outstanding.saturating_sub(self.syncs_since_execute);
                self.syncs_since_execute = 0;
            }
            _ => {}
        }
    }

    /// True when the server holds no state for this client: it may serve another.
    pub fn releasable(&self) -> bool {
        self.status == TransactionStatus::Idle && self.outstanding == 0 && !self.batch_open && !self.copy_in
    }

    /// True when the client holds the server inside a transaction and owes no answer.
    pub fn idle_in_transaction(&self) -> bool {
        self.status != TransactionStatus::Idle && self.outstanding == 0
    }

    pub fn status(&self) -> TransactionStatus {
        self.status
    }

    pub fn outstanding(&self) -> u32 {
        self.outstanding
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TransactionStatus::*;

    #[test]
    fn pipelined_syncs_hold_the_server_until_the_last_ready_for_query() {
        let mut tracker = TransactionTracker::default();
        for tag in *b"PBESPBESPBES" {
            tracker.client_message(tag);
        }
        for expected_release in [false, false, true] {
            tracker.server_message(b'Z', Some(Idle));
            assert_eq!(tracker.releasable(), expected_release);
        }
    }

    #[test]
    fn transaction_block_holds_the_server() {
        let mut tracker = TransactionTracker::default();
        tracker.client_message(b'Q');
        tracker.server_message(b'Z', Some(InTransaction));
        assert!(!tracker.releasable());
        assert!(tracker.idle_in_transaction());
        tracker.client_message(b'Q');
        tracker.server_message(b'Z', Some(Idle));
        assert!(tracker.releasable());
    }

    #[test]
    fn unsynced_batch_and_copy_in_hold_the_server() {
        let mut tracker = TransactionTracker::default();
        tracker.client_message(b'P');
        tracker.client_message(b'H');
        assert!(!tracker.releasable());
        tracker.client_message(b'S');
        tracker.server_message(b'Z', Some(Idle));
        assert!(tracker.releasable());

        tracker.client_message(b'Q');
        tracker.server_message(b'G', None);
        tracker.client_message(b'S'); // ignored by the server during COPY FROM STDIN
        assert!(!tracker.releasable());
        tracker.client_message(b'c');
        tracker.server_message(b'Z', Some(Idle));
        assert!(tracker.releasable());
    }

    #[test]
    fn sync_sent_before_copy_in_response_is_not_awaited() {
        // Drivers send Bind, Execute, Sync, then copy data, CopyDone, Sync: one ReadyForQuery.
        let mut tracker = TransactionTracker::default();
        for tag in *b"BES" {
            tracker.client_message(tag);
        }
        tracker.server_message(b'2', None);
        tracker.server_message(b'G', None);
        for tag in *b"ddcS" {
            tracker.client_message(tag);
        }
        tracker.server_message(b'C', None);
        tracker.server_message(b'Z', Some(Idle));
        assert!(tracker.releasable());
    }
}
