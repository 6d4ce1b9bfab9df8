//! The front door's sans-I/O core against arbitrary client bytes: the first packet (startup,
//! SSL/GSS, cancel), the startup request and protocol negotiation, then every password exchange
//! (MD5, SCRAM, cleartext; known user and the mock exchange of an unknown one) fed the rest of
//! the input as `'p'` message bodies. Nothing may panic, and a mock exchange never succeeds.
#![no_main]

use bypass_wire::auth::{Exchange, Method, MockKey, Step};
use bypass_wire::auth_file::Secret;
use bypass_wire::startup::decode_startup;
use bypass_wire::{StartupPacket, StartupRequest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    if let Ok(Some((packet, used))) = decode_startup(data) {
        if let StartupPacket::Startup(params) = packet {
            if let Ok(request) = StartupRequest::from_params(&params) {
                let mut out = Vec::new();
                request.write_negotiation(&mut out);
            }
        }
        rest = &data[used..];
    }
    let mock = MockKey::from_bytes([3; 32]);
    // A verifier with few iterations keeps runs fast; the exchange code is the same.
    let verifier = bypass_wire::scram::Verifier::from_password_and_salt(b"pw", b"salt".to_vec(), 2);
    let known = Secret::Scram(std::sync::Arc::new(verifier));
    let md5 = Secret::Md5(bypass_wire::md5::stored_hash(b"u", b"pw"));
    for method in [Method::Md5, Method::ScramSha256, Method::Password] {
        for secret in [Some(&known), Some(&md5), None] {
            let mut out = Vec::new();
            let Some(mut exchange) = Exchange::start(method, "u", secret, &mock, &mut out) else { continue };
            for body in rest.split(|&byte| byte == 0xFE).take(4) {
                match exchange.respond(body, &mut out) {
                    Ok(Step::Continue) => {}
                    Ok(Step::Done(_)) => {
                        assert!(secret.is_some(), "a mock exchange succeeded");
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
    }
});
