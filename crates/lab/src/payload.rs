//! Deterministic result payloads that stock PostgreSQL produces and a client verifies byte by
//! byte, without either side storing them.
//!
//! A payload of `size` bytes for `seed` is `ceil(size / ROW_BYTES)` rows of one text column. Row
//! `i` (1-based) is the 32 hex digits of `md5("<seed>:<i>")` repeated and cut to
//! `min(ROW_BYTES, size - (i - 1) * ROW_BYTES)` bytes. A lost, duplicated or reordered segment
//! changes a row's framing or its digits, so every byte is checked at a known offset.
//!
//! ```text
//!   SELECT left(repeat(md5('7:' || i), 256), least(…)) FROM generate_series(1, rows) AS i
//!   row 1: 3f2a…(32 hex)3f2a…  row 2: 91c0…  …  last row: shorter
//! ```

use md5::{Digest, Md5};

use bypass_dispatch::error::{DispatchError, Result};

/// Bytes of every full row; large enough that framing overhead is ~0.1 %, small enough that a
/// row always fits a relay buffer.
pub const ROW_BYTES: u64 = 8192;
/// Length of one md5 hex digest, the period of the pattern inside a row.
const DIGEST_HEX: usize = 32;
/// The largest payload a query may ask for (the issue's sweep ends at 128 MB).
pub const PAYLOAD_BYTES_MAX: u64 = 1 << 30;

/// The SQL text asking for `size` bytes of payload `seed`.
pub fn query(seed: u64, size: u64) -> String {
    assert!((1..=PAYLOAD_BYTES_MAX).contains(&size), "payload size {size} out of range");
    let rows = size.div_ceil(ROW_BYTES);
    let repeats = ROW_BYTES.min(size).div_ceil(DIGEST_HEX as u64);
    format!(
        "SELECT left(repeat(md5('{seed}:' || i), {repeats}), least({size}::bigint - (i - 1) * {ROW_BYTES}, \
         {ROW_BYTES})::int) FROM generate_series(1, {rows}) AS i"
    )
}

/// The 32 hex digits row `row` of payload `seed` repeats.
pub fn row_pattern(seed: u64, row: u64) -> [u8; DIGEST_HEX] {
    let digest = Md5::digest(format!("{seed}:{row}").as_bytes());
    let mut hex = [0u8; DIGEST_HEX];
    for (i, byte) in digest.iter().enumerate() {
        hex[2 * i] = HEX[usize::from(byte >> 4)];
        hex[2 * i + 1] = HEX[usize::from(byte & 0xf)];
    }
    hex
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Checks the rows of one result as they arrive.
#[derive(Debug, Clone)]
pub struct Verifier {
    /// Identifies the query in error messages.
    query_number: u64,
    seed: u64,
    size: u64,
    rows_seen: u64,
    bytes_seen: u64,
}

impl Verifier {
    pub fn new(query_number: u64, seed: u64, size: u64) -> Self {
        Verifier { query_number, seed, size, rows_seen: 0, bytes_seen: 0 }
    }

    /// Checks the next row's value.
    pub fn row(&mut self, value: &[u8]) -> Result<()> {
        let row = self.rows_seen + 1;
        let expected_len = ROW_BYTES.min(self.size.saturating_sub(self.bytes_seen));
        if value.len() as u64 != expected_len {
            let detail = format!("row {row} has {} bytes, expected {expected_len}", value.len());
            return Err(self.mismatch(self.bytes_seen, detail));
        }
        let pattern = row_pattern(self.seed, row);
        for (chunk_index, chunk) in value.chunks(DIGEST_HEX).enumerate() {
            if chunk != &pattern[..chunk.len()] {
                let first_bad = chunk.iter().zip(pattern.iter()).position(|(a, b)| a != b).unwrap_or(0);
                let offset = self.bytes_seen + (chunk_index * DIGEST_HEX + first_bad) as u64;
                return Err(self.mismatch(offset, format!("row {row} differs from its pattern")));
            }
        }
        self.rows_seen = row;
        self.bytes_seen += expected_len;
        Ok(())
    }

    /// Checks that the whole payload arrived; call at CommandComplete.
    pub fn finish(&self) -> Result<u64> {
        if self.bytes_seen != self.size {
            let detail = format!("result ended after {} of {} bytes", self.bytes_seen, self.size);
            return Err(self.mismatch(self.bytes_seen, detail));
        }
        Ok(self.bytes_seen)
    }

    fn mismatch(&self, offset: u64, detail: String) -> DispatchError {
        DispatchError::PayloadMismatch { query: self.query_number, offset, detail }
    }
}

/// The value bytes of a complete payload (for tests and small checks).
pub fn expected(seed: u64, size: u64) -> Vec<Vec<u8>> {
    let rows = size.div_ceil(ROW_BYTES);
    (1..=rows)
        .map(|row| {
            let len = ROW_BYTES.min(size - (row - 1) * ROW_BYTES) as usize;
            row_pattern(seed, row).iter().copied().cycle().take(len).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the pattern is md5 hex as PostgreSQL prints it; method: a known digest.
    #[test]
    fn row_pattern_is_md5_hex() {
        // md5("7:1") computed independently.
        let digest = Md5::digest(b"7:1");
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(&row_pattern(7, 1)[..], hex.as_bytes());
    }

    // Goal: the verifier accepts exactly the expected rows and finishes; method: feed them.
    #[test]
    fn verifier_accepts_the_expected_payload() {
        for size in [1, 31, 32, 33, ROW_BYTES - 1, ROW_BYTES, ROW_BYTES + 1, 3 * ROW_BYTES + 5] {
            let mut verifier = Verifier::new(1, 42, size);
            for row in expected(42, size) {
                verifier.row(&row).expect("expected rows pass");
            }
            assert_eq!(verifier.finish().expect("complete"), size);
        }
    }

    // Goal: one flipped byte, a short row, a missing row are all caught at the right offset;
    // method: corrupt the expected payload.
    #[test]
    fn verifier_reports_the_first_bad_offset() {
        let rows = expected(5, 2 * ROW_BYTES);
        let mut corrupted = rows[1].clone();
        corrupted[100] ^= 1;
        let mut verifier = Verifier::new(9, 5, 2 * ROW_BYTES);
        verifier.row(&rows[0]).expect("first row fine");
        let error = verifier.row(&corrupted).expect_err("flipped byte");
        assert!(matches!(error, DispatchError::PayloadMismatch { query: 9, offset, .. } if offset == ROW_BYTES + 100));
        let mut verifier = Verifier::new(1, 5, 2 * ROW_BYTES);
        assert!(verifier.row(&rows[0][..10]).is_err(), "short row");
        let mut verifier = Verifier::new(1, 5, 2 * ROW_BYTES);
        verifier.row(&rows[0]).expect("first row");
        assert!(verifier.finish().is_err(), "missing row");
        let mut wrong_seed = Verifier::new(1, 6, 2 * ROW_BYTES);
        assert!(wrong_seed.row(&rows[0]).is_err(), "other seed");
    }

    // Goal: the SQL asks for the right number of rows and repeats; method: read the text.
    #[test]
    fn query_text_matches_the_layout() {
        let sql = query(3, 3 * ROW_BYTES + 1);
        assert!(sql.contains("generate_series(1, 4)"), "{sql}");
        assert!(sql.contains("repeat(md5('3:' || i), 256)"), "{sql}");
        assert!(query(3, 1).contains("repeat(md5('3:' || i), 1)"));
    }

    // Goal: the texts the dispatcher's routing tests use are this module's queries, and payload
    // queries route without a catalog lookup and share one fingerprint; method: compare.
    #[test]
    fn queries_route_as_one_shape() {
        use bypass_dispatch::routing::{classify, fingerprint};
        assert_eq!(
            query(1, 100_000),
            "SELECT left(repeat(md5('1:' || i), 256), least(100000::bigint - (i - 1) * 8192, 8192)::int) \
             FROM generate_series(1, 13) AS i"
        );
        assert!(classify(&query(1, 100_000)).functions.is_empty(), "payload query needs no lookup");
        assert_eq!(fingerprint(&query(1, 10)), fingerprint(&query(99, 1 << 27)));
    }
}
