//! Session parameters a pooler must keep equal between a client and whichever server it uses.
//! Servers report these with ParameterStatus whenever they change, so both sides can be tracked.

/// The tracked parameters, in a fixed order.
pub const TRACKED: [&str; 6] =
    ["client_encoding", "DateStyle", "TimeZone", "IntervalStyle", "standard_conforming_strings", "application_name"];

/// One value per tracked parameter; `None` = unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParamSet {
    values: [Option<String>; TRACKED.len()],
    /// All values in one buffer (each followed by a NUL, unknown as 0xFF), rebuilt on every change.
    /// Equal packed forms mean nothing to sync: one comparison of contiguous bytes per checkout
    /// instead of six strings on six cache lines.
    packed: Vec<u8>,
}

/// Index of a tracked parameter; names compare case-insensitively, as GUC names do.
pub fn tracked_index(name: &[u8]) -> Option<usize> {
    TRACKED.iter().position(|tracked| tracked.as_bytes().eq_ignore_ascii_case(name))
}

impl ParamSet {
    /// Every value in one byte string: equal for equal sets (the key of parameter ids).
    pub fn packed(&self) -> &[u8] {
        &self.packed
    }

    pub fn get(&self, index: usize) -> Option<&str> {
        self.values[index].as_deref()
    }

    /// Records `value` if `name` is tracked; returns whether it was.
    pub fn update(&mut self, name: &[u8], value: &[u8]) -> bool {
        let Some(index) = tracked_index(name) else {
            return false;
        };
        let slot = &mut self.values[index];
        if slot.as_deref().map(str::as_bytes) != Some(value) {
            *slot = Some(String::from_utf8_lossy(value).into_owned());
            self.repack();
        }
        true
    }

    fn repack(&mut self) {
        self.packed.clear();
        for value in &self.values {
            match value {
                Some(value) => self.packed.extend_from_slice(value.as_bytes()),
                None => self.packed.push(0xFF),
            }
            self.packed.push(0);
        }
    }

    /// Writes `SET` statements for every parameter whose value in `wanted` differs from ours into
    /// `sql`; returns how many were written.
    pub fn diff_into(&self, wanted: &ParamSet, sql: &mut String) -> usize {
        if self.packed == wanted.packed {
            return 0;
        }
        let mut count = 0;
        for (index, name) in TRACKED.iter().enumerate() {
            let Some(value) = wanted.get(index) else { continue };
            if self.get(index) == Some(value) {
                continue;
            }
            sql.push_str("SET ");
            sql.push_str(name);
            sql.push_str(" TO ");
            push_literal(sql, value);
            sql.push(';');
            count += 1;
        }
        count
    }
}

/// Appends `value` as a SQL string literal.
fn push_literal(sql: &mut String, value: &str) {
    sql.push('\'');
    for c in value.chars() {
        if c == '\'' {
            sql.push('\'');
        }
        sql.push(c);
    }
    sql.push('\'');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_sets_only_what_differs_and_quotes_values() {
        let mut server = ParamSet::default();
        server.update(b"TimeZone", b"UTC");
        server.update(b"application_name", b"a");
        let mut client = server.clone();
        client.update(b"application_name", b"it's");
        let mut sql = String::new();
        assert_eq!(server.diff_into(&client, &mut sql), 1);
        assert_eq!(sql, "SET application_name TO 'it''s';");
        assert!(!server.update(b"search_path", b"x"));
        assert!(server.update(b"timezone", b"UTC"));
    }
}
