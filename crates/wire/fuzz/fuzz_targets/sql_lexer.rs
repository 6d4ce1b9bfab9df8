//! The SQL lexer behind routing and the session-state guard, on arbitrary text: it ends, every
//! token consumes input, and statement splitting agrees with the token stream.
#![no_main]

use bypass_wire::sql::{first_token, has_several_statements, statements, Lexer, Token};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut lexer = Lexer::new(&text);
    let mut last = 0;
    let mut count = 0;
    while let Some(token) = lexer.next() {
        assert!(lexer.position() > last, "a token consumed nothing: {token:?}");
        last = lexer.position();
        count += 1;
    }
    assert!(count <= text.len());
    let (found, _) = statements(&text, 64);
    assert!(found.iter().all(|statement| !statement.is_empty()));
    assert!(found.iter().flatten().all(|token| !matches!(token, Token::Comment(_) | Token::Semicolon)));
    if has_several_statements(&text) {
        assert!(found.len() >= 2, "several statements, but {} found", found.len());
    }
    let _ = first_token(&text);
});
