//! SCRAM-SHA-256 both ways against arbitrary peers: the server side with arbitrary client-first
//! and client-final messages, the client side with arbitrary server-first and server-final, and
//! verifier text parsing. Nothing may panic; a random proof must not verify.
#![no_main]

use bypass_wire::scram::{ClientExchange, ClientSecret, ServerExchange, Verifier};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&byte| byte == 0xFF);
    let (first, second, third) = (parts.next().unwrap_or_default(), parts.next(), parts.next());
    let _ = Verifier::parse(&String::from_utf8_lossy(first));
    let verifier = Verifier::from_password_and_salt(b"pw", b"salt".to_vec(), 2);
    if let Ok((server, _)) = ServerExchange::start(verifier, first) {
        assert!(server.finish(second.unwrap_or_default()).is_err(), "an arbitrary proof verified");
    }
    let (mut client, _) = ClientExchange::start(ClientSecret::Password(b"pw".to_vec()));
    if client.respond(second.unwrap_or(first)).is_ok() {
        let _ = client.verify(third.unwrap_or_default());
    }
});
