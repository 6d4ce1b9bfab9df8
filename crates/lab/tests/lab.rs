//! The lab builds real namespaces, a bridge and shaped links (needs root, as in CI).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

use bypass_dispatch::netns;
use bypass_lab::lab::{Lab, LabSpec, VIP};

fn spec(tag: &str) -> LabSpec {
    LabSpec { name: bypass_lab::lab::unique_name(tag), ..LabSpec::default() }
}

/// Serves one connection on `address` in `namespace`, answering with `banner`.
fn serve_banner(
    namespace: &str,
    address: SocketAddr,
    banner: &'static str,
) -> std::thread::JoinHandle<anyhow::Result<()>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let handle = netns::spawn_in(namespace, "banner", move || {
        let listener = TcpListener::bind(address).map_err(|e| bypass_dispatch::DispatchError::io("bind", e))?;
        ready_tx.send(()).expect("test waits for readiness");
        let (mut stream, _) = listener.accept().map_err(|e| bypass_dispatch::DispatchError::io("accept", e))?;
        stream.write_all(banner.as_bytes()).map_err(|e| bypass_dispatch::DispatchError::io("write", e))?;
        Ok(())
    })
    .expect("spawn banner thread");
    ready_rx.recv().expect("banner server ready");
    std::thread::spawn(move || handle.join().expect("banner thread").map_err(anyhow::Error::from))
}

fn read_banner(namespace: &str, address: SocketAddr) -> anyhow::Result<String> {
    Ok(netns::run_in(namespace, move || {
        let mut stream = TcpStream::connect(address).map_err(|e| bypass_dispatch::DispatchError::io("connect", e))?;
        let mut text = String::new();
        stream.read_to_string(&mut text).map_err(|e| bypass_dispatch::DispatchError::io("read", e))?;
        Ok(text)
    })?)
}

// Goal: a client reaching the VIP gets the dispatcher, never a backend that also holds the VIP;
// and it reaches backends by their own address. Method: banner servers on the same VIP port in
// disp and be1, and on be2's address; connect from cli1.
#[test]
fn vip_reaches_the_dispatcher_and_backends_are_reachable() -> anyhow::Result<()> {
    let lab = Lab::up_owned(spec("la"))?;
    let vip = SocketAddr::from((VIP, 7000));
    let disp = serve_banner(&lab.dispatcher().namespace, vip, "disp");
    let be1 = serve_banner(&lab.backend(1).namespace, vip, "be1");
    let be2_address = SocketAddr::from((lab.backend(2).address, 7001));
    let be2 = serve_banner(&lab.backend(2).namespace, be2_address, "be2");
    let client = lab.client(1).namespace;
    assert_eq!(read_banner(&client, vip)?, "disp");
    assert_eq!(read_banner(&client, be2_address)?, "be2");
    disp.join().expect("disp")?;
    be2.join().expect("be2")?;
    // be1's server never got a connection: the VIP answered from the dispatcher only.
    drop(be1);
    Ok(())
}

// Goal: server links carry tbf at the asked rate in both directions, client links carry none.
// Method: read `tc qdisc show` in the namespaces.
#[test]
fn server_links_are_shaped_and_client_links_are_not() -> anyhow::Result<()> {
    let mut spec = spec("lb");
    spec.link_rate_mbit = 700;
    let lab = Lab::up_owned(spec)?;
    let show = |ns: &str, dev: &str| -> anyhow::Result<String> {
        let output = netns::run_args("tc", &["-n", ns, "qdisc", "show", "dev", dev])?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let sw = lab.switch_namespace();
    for host in [lab.dispatcher(), lab.backend(1), lab.backend(2)] {
        assert!(show(&host.namespace, "eth0")?.contains("rate 700Mbit"), "{} eth0", host.short);
        assert!(show(&sw, &host.switch_port)?.contains("rate 700Mbit"), "{}", host.switch_port);
    }
    assert!(!show(&lab.client(1).namespace, "eth0")?.contains("tbf"));
    assert!(!show(&sw, &lab.client(2).switch_port)?.contains("tbf"));
    Ok(())
}

// Goal: up is idempotent and cleans up after a failed run; down removes everything.
// Method: leave a stale namespace of the lab behind (as a crash would), bring the lab up twice,
// then down, and list /run/netns.
#[test]
fn up_is_idempotent_recovers_from_leftovers_and_down_removes_all() -> anyhow::Result<()> {
    let spec = spec("lc");
    let stale = format!("{}-be1", spec.name);
    netns::run_args("ip", &["netns", "add", &stale])?;
    let first = Lab::up(spec.clone())?;
    let marker = std::fs::metadata(spec.state_dir().join("complete"))?.modified()?;
    let second = Lab::up(spec.clone())?;
    assert_eq!(std::fs::metadata(spec.state_dir().join("complete"))?.modified()?, marker, "second up rebuilt");
    assert!(netns::exists(&first.backend(1).namespace));
    drop((first, second));
    Lab::down(&spec.name)?;
    let left: Vec<String> = std::fs::read_dir(netns::NETNS_DIR)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!("{}-", spec.name)))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    Lab::down(&spec.name)?;
    Ok(())
}
