//! The front door against real clients: tokio-postgres (SCRAM, MD5, TLS via rustls) and raw
//! sockets for what no driver sends. A tiny server behind the door answers the welcome and
//! counts what it admitted, so every test checks both the client's view and the server's.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bypass_frontdoor::{Admission, CancelKey, FrontDoor, FrontDoorConfig, GuardSettings, Method, Proof};
use bypass_wire::auth_file::AuthFile;
use bypass_wire::hba::Hba;
use tokio::net::TcpListener;

/// What the server behind the door saw.
#[derive(Default)]
struct Seen {
    admitted: AtomicUsize,
    cancels: AtomicUsize,
    refused: AtomicUsize,
    proofs: Mutex<Vec<String>>,
}

/// Serves `door` on a free port in the background; returns the address and what it saw.
async fn serve(door: Arc<FrontDoor>) -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let seen = Arc::new(Seen::default());
    let counters = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (door, seen) = (door.clone(), counters.clone());
            tokio::spawn(async move {
                match door.accept(tcp, 16 * 1024).await {
                    Ok(Admission::Client(mut client)) => {
                        seen.admitted.fetch_add(1, Ordering::SeqCst);
                        seen.proofs.lock().expect("lock").push(proof_kind(&client.proof).into());
                        let parameters = vec![("server_version".to_string(), "15.0".to_string())];
                        let _ = client.welcome(&parameters, CancelKey::random()).await;
                        let mut sink = [0u8; 256];
                        while matches!(client.stream.read(&mut sink).await, Ok(n) if n > 0) {}
                    }
                    Ok(Admission::Cancel(_)) => {
                        seen.cancels.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => {
                        seen.refused.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    (address, seen)
}

fn proof_kind(proof: &Proof) -> &'static str {
    match proof {
        Proof::Trust => "trust",
        Proof::Certificate => "cert",
        Proof::Scram { .. } => "scram",
        Proof::Md5 { .. } => "md5",
        Proof::Password(_) => "password",
    }
}

fn users() -> AuthFile {
    let md5 = bypass_wire::md5::stored_hash(b"bob", b"bob-pw");
    let scram = bypass_wire::scram::Verifier::from_password(b"carol-pw", 4096).to_text();
    AuthFile::parse(&format!("\"alice\" \"alice-pw\"\n\"bob\" \"{md5}\"\n\"carol\" \"{scram}\"\n")).expect("valid")
}

fn door_with(method: Method) -> Arc<FrontDoor> {
    FrontDoor::new(FrontDoorConfig { method, ..FrontDoorConfig::scram(users()) })
}

async fn login(address: SocketAddr, user: &str, password: &str) -> Result<(), String> {
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(address.port()).user(user).password(password).dbname("app");
    config.connect_timeout(Duration::from_secs(20));
    match config.connect(tokio_postgres::NoTls).await {
        Ok(_) => Ok(()),
        Err(error) => Err(error.as_db_error().map(|db| db.code().code().to_owned()).unwrap_or(error.to_string())),
    }
}

#[tokio::test]
async fn scram_and_md5_admit_right_passwords_and_refuse_everything_else_with_28p01() {
    // Goal: each method admits the right password and answers 28P01 to a wrong one and to an
    // unknown user. Method: tokio-postgres against the door under scram-sha-256 and md5.
    for method in [Method::ScramSha256, Method::Md5] {
        let (address, seen) = serve(door_with(method)).await;
        assert_eq!(login(address, "alice", "alice-pw").await, Ok(()), "{method:?} plaintext secret");
        assert_eq!(login(address, "carol", "carol-pw").await, Ok(()), "{method:?} SCRAM verifier");
        assert_eq!(login(address, "alice", "wrong").await, Err("28P01".into()), "{method:?} wrong");
        assert_eq!(login(address, "nobody", "x").await, Err("28P01".into()), "{method:?} unknown");
        let bob = if method == Method::Md5 { Ok(()) } else { Err("28P01".to_string()) };
        assert_eq!(login(address, "bob", "bob-pw").await, bob, "{method:?} md5 hash");
        assert_eq!(seen.admitted.load(Ordering::SeqCst), if method == Method::Md5 { 3 } else { 2 });
    }
}

/// A blocking raw client.
struct Raw(std::net::TcpStream);

impl Raw {
    fn connect(address: SocketAddr) -> Raw {
        let stream = std::net::TcpStream::connect(address).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        Raw(stream)
    }

    fn send(&mut self, bytes: &[u8]) {
        self.0.write_all(bytes).expect("send");
    }

    fn startup(&mut self, user: &str) {
        let mut packet = Vec::new();
        bypass_wire::startup::encode_startup(&mut packet, &[("user", user), ("database", "app")]);
        self.send(&packet);
    }

    /// One message: (tag, body); `None` at EOF.
    fn message(&mut self) -> Option<(u8, Vec<u8>)> {
        let mut header = [0u8; 5];
        self.0.read_exact(&mut header).ok()?;
        let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let mut body = vec![0u8; length.checked_sub(4)?];
        self.0.read_exact(&mut body).ok()?;
        Some((header[0], body))
    }

    fn byte(&mut self) -> Option<u8> {
        let mut byte = [0u8; 1];
        self.0.read_exact(&mut byte).ok().map(|_| byte[0])
    }
}

/// The shape of a login as a client sees it: each message's tag, an authentication request's
/// code, an error's SQLSTATE; the SCRAM client runs with a wrong password.
fn login_shape(address: SocketAddr, user: &str) -> Vec<String> {
    use bypass_wire::scram::{ClientExchange, ClientSecret, MECHANISM};
    let mut raw = Raw::connect(address);
    raw.startup(user);
    let mut shape = Vec::new();
    let mut scram = None;
    while let Some((tag, body)) = raw.message() {
        match tag {
            b'R' => {
                let code = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                shape.push(format!("R{code}"));
                let mut reply = Vec::new();
                match code {
                    5 => {
                        bypass_wire::auth_messages::encode_password(&mut reply, b"md5ffffffffffffffffffffffffffffffff")
                    }
                    10 => {
                        let (exchange, first) = ClientExchange::start(ClientSecret::Password(b"wrong".to_vec()));
                        scram = Some(exchange);
                        bypass_wire::auth_messages::encode_sasl_initial(&mut reply, MECHANISM, first.as_bytes());
                    }
                    11 => {
                        let exchange = scram.as_mut().expect("SASL started");
                        let final_message = exchange.respond(&body[4..]).expect("server-first is valid");
                        bypass_wire::auth_messages::encode_sasl_response(&mut reply, final_message.as_bytes());
                    }
                    _ => {}
                }
                raw.send(&reply);
            }
            b'E' => {
                let fields = bypass_wire::backend::BackendMessage::decode(b'E', &body).expect("valid error");
                let bypass_wire::BackendMessage::ErrorResponse(fields) = fields else { unreachable!() };
                let message = String::from_utf8_lossy(fields.message().unwrap_or_default()).replace(user, "<user>");
                shape.push(format!("E{} {message}", String::from_utf8_lossy(fields.code().unwrap_or_default())));
            }
            other => shape.push((other as char).to_string()),
        }
    }
    shape
}

#[tokio::test]
async fn an_unknown_user_sees_exactly_what_a_known_user_with_a_wrong_password_sees() {
    // Goal: user names cannot be told apart by the exchange. Method: record the message shape of
    // a login under scram and md5 for a known user (plaintext and SCRAM secrets) with a wrong
    // password and for an unknown user; they must be equal.
    for method in [Method::ScramSha256, Method::Md5] {
        let (address, _) = serve(door_with(method)).await;
        let shapes = tokio::task::spawn_blocking(move || {
            ["alice", "nobody", "someone-else"].map(|user| login_shape(address, user))
        })
        .await
        .expect("joined");
        assert!(shapes[0].last().is_some_and(|last| last.starts_with("E28P01")), "{method:?}: {:?}", shapes[0]);
        assert_eq!(shapes[0], shapes[1], "{method:?}");
        assert_eq!(shapes[1], shapes[2], "{method:?}");
    }
}

#[tokio::test]
async fn encryption_requests_are_answered_and_cancels_reach_the_server() {
    // Goal: negotiation without TLS: GSSENCRequest and SSLRequest get 'N', plaintext follows;
    // a CancelRequest is handed to the server. Method: raw packets.
    let (address, seen) = serve(door_with(Method::Trust)).await;
    tokio::task::spawn_blocking(move || {
        let mut raw = Raw::connect(address);
        for request in [bypass_wire::StartupPacket::GssEncRequest, bypass_wire::StartupPacket::SslRequest] {
            let mut packet = Vec::new();
            bypass_wire::startup::encode_request(&mut packet, &request);
            raw.send(&packet);
            assert_eq!(raw.byte(), Some(b'N'));
        }
        raw.startup("anyone");
        let tags: Vec<u8> = std::iter::from_fn(|| raw.message()).map(|(tag, _)| tag).take(4).collect();
        assert_eq!(tags, b"RSKZ");
        let mut cancel = Raw::connect(address);
        let mut packet = Vec::new();
        let request = bypass_wire::StartupPacket::Cancel { process_id: 7, secret_key: &[1, 2, 3, 4] };
        bypass_wire::startup::encode_request(&mut packet, &request);
        cancel.send(&packet);
        assert_eq!(cancel.message(), None, "a cancel gets no answer");
    })
    .await
    .expect("joined");
    wait_for(|| seen.cancels.load(Ordering::SeqCst) == 1).await;
    assert_eq!(seen.admitted.load(Ordering::SeqCst), 1);
}

async fn wait_for(condition: impl Fn() -> bool) {
    for _ in 0..200 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("condition not reached in 5 s");
}

#[tokio::test]
async fn malformed_oversized_and_random_bytes_are_refused_and_the_door_keeps_serving() {
    // Goal: no input takes the door down. Method: a bad length, an oversized startup packet,
    // protocol 2, random bytes, then a good login.
    let (address, seen) = serve(door_with(Method::ScramSha256)).await;
    let inputs: Vec<Vec<u8>> = vec![
        vec![0, 0, 0, 3, 0, 0, 0, 0],
        vec![0, 1, 0, 0, 0, 3, 0, 0],
        vec![0, 0, 0, 9, 0, 2, 0, 0, 0],
        (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect(),
    ];
    let count = inputs.len();
    tokio::task::spawn_blocking(move || {
        for input in inputs {
            let mut raw = Raw::connect(address);
            let _ = raw.0.write_all(&input);
            let (tag, body) = raw.message().expect("a FATAL before the close");
            assert_eq!(tag, b'E', "{body:?}");
            let text = String::from_utf8_lossy(&body);
            assert!(text.contains("08P01") || text.contains("0A000"), "{text}");
        }
    })
    .await
    .expect("joined");
    wait_for(|| seen.refused.load(Ordering::SeqCst) == count).await;
    assert_eq!(login(address, "alice", "alice-pw").await, Ok(()));
}

#[tokio::test]
async fn hba_decides_the_method_and_refuses_with_28000() {
    // Goal: hba rules pick the method by user; reject and no match are 28000. Method: three users.
    let hba = Hba::parse("host all alice 127.0.0.1/32 scram-sha-256\nhost all bob all reject\n", "hba").expect("valid");
    let door = FrontDoor::new(FrontDoorConfig { hba: Some(hba), ..FrontDoorConfig::scram(users()) });
    let (address, _) = serve(door).await;
    assert_eq!(login(address, "alice", "alice-pw").await, Ok(()));
    assert_eq!(login(address, "bob", "bob-pw").await, Err("28000".into()));
    assert_eq!(login(address, "carol", "carol-pw").await, Err("28000".into()));
}

#[tokio::test]
async fn failed_logins_are_delayed_and_an_address_over_its_bound_is_refused() {
    // Goal: auth_failure_delay holds a failure back at least that long; past
    // failures_per_address_max the address is refused before any exchange, even with the right
    // password. Method: wrong passwords from 127.0.0.1, then the right one.
    let guard = GuardSettings {
        failure_delay: Duration::from_millis(300),
        failures_per_address_max: 2,
        failure_window: Duration::from_secs(60),
    };
    let door = FrontDoor::new(FrontDoorConfig { guard, ..FrontDoorConfig::scram(users()) });
    let (address, _) = serve(door.clone()).await;
    let started = Instant::now();
    assert_eq!(login(address, "alice", "wrong").await, Err("28P01".into()));
    assert!(started.elapsed() >= Duration::from_millis(300), "the failure was not delayed");
    assert_eq!(login(address, "nobody", "wrong").await, Err("28P01".into()));
    assert_eq!(login(address, "alice", "alice-pw").await, Err("28000".into()), "over the bound");
    assert_eq!(door.guard().tracked_addresses(), 1);
}
