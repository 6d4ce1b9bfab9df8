//! The client listeners: one `SO_REUSEPORT` socket per shard on the pooler's address, and the
//! check that no other process listens there too. `SO_REUSEPORT` lets every socket of the same
//! user share a port, so a second pooler started by mistake would silently take about half of
//! the new connections; after binding, the listening sockets on the address are read from
//! `/proc/net/tcp{,6}` and any that is not one of ours makes the start fail.
//!
//! With `unix_socket_dir`, one Unix-domain socket `.s.PGSQL.<port>` too, guarded as PostgreSQL
//! guards its own: a lock file beside it names the process serving it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use socket2::{Domain, Socket, Type};

/// TCP state `LISTEN` in `/proc/net/tcp`.
const TCP_LISTEN: &str = "0A";
/// Bound on `/proc/<pid>/fd` entries read while naming the other listener's process.
const FD_SCAN_MAX: usize = 1 << 20;

/// Binds one listener per shard on `address` (port 0 picks one free port for all) and checks
/// that no other process listens on the same address.
pub fn bind_shards(address: SocketAddr, shards: usize, backlog: i32) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut address = address;
    let mut listeners = Vec::with_capacity(shards);
    for _ in 0..shards {
        let listener = bind_reuseport(address, backlog)?;
        address = listener.local_addr()?;
        listeners.push(listener);
    }
    check_sole_listener(address, &listeners)?;
    Ok(listeners)
}

fn bind_reuseport(address: SocketAddr, backlog: i32) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(backlog)?;
    Ok(socket.into())
}

/// Fails when a listening socket on `address` exists that is not one of `ours`.
fn check_sole_listener(address: SocketAddr, ours: &[std::net::TcpListener]) -> std::io::Result<()> {
    let our_inodes: Vec<u64> = ours.iter().filter_map(|listener| socket_inode(listener.as_raw_fd())).collect();
    let others: Vec<u64> = listening_inodes(address).into_iter().filter(|inode| !our_inodes.contains(inode)).collect();
    let Some(&other) = others.first() else { return Ok(()) };
    let owner = match process_with_socket(other) {
        Some((pid, name)) => format!(" (pid {pid}, {name})"),
        None => String::new(),
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!(
            "{address} is already served by another process{owner}; two poolers on one address would split \
             its clients between them: stop the other one or choose another listen_addr"
        ),
    ))
}

fn socket_inode(fd: i32) -> Option<u64> {
    // SAFETY: fstat writes only into the zeroed struct we pass; `fd` is open (we own the listener).
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::fstat(fd, &mut stat) } == 0).then_some(stat.st_ino)
}

/// Inodes of the TCP sockets listening on exactly `address`.
fn listening_inodes(address: SocketAddr) -> Vec<u64> {
    let table = match address {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let text = std::fs::read_to_string(table).unwrap_or_default();
    text.lines().skip(1).filter_map(parse_listener).filter(|(at, _)| *at == address).map(|(_, inode)| inode).collect()
}

/// (local address, inode) of a `/proc/net/tcp{,6}` line in state LISTEN.
fn parse_listener(line: &str) -> Option<(SocketAddr, u64)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(3) != Some(&TCP_LISTEN) {
        return None;
    }
    let (ip, port) = fields.get(1)?.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = parse_proc_ip(ip)?;
    Some((SocketAddr::new(ip, port), fields.get(9)?.parse().ok()?))
}

/// `/proc/net/tcp` prints an address as 32-bit words of network-order bytes read in host order.
fn parse_proc_ip(hex: &str) -> Option<IpAddr> {
    let bytes = |words: usize| -> Option<Vec<u8>> {
        let mut bytes = Vec::with_capacity(words * 4);
        for index in 0..words {
            let word = u32::from_str_radix(hex.get(index * 8..index * 8 + 8)?, 16).ok()?;
            bytes.extend_from_slice(&word.to_ne_bytes());
        }
        Some(bytes)
    };
    match hex.len() {
        8 => <[u8; 4]>::try_from(bytes(1)?).ok().map(|octets| IpAddr::V4(Ipv4Addr::from(octets))),
        32 => <[u8; 16]>::try_from(bytes(4)?).ok().map(|octets| IpAddr::V6(Ipv6Addr::from(octets))),
        _ => None,
    }
}

/// The process holding socket `inode`, and its name, if it can be found.
fn process_with_socket(inode: u64) -> Option<(u32, String)> {
    let wanted = format!("socket:[{inode}]");
    let mut scanned = 0usize;
    for process in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = process.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(process.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            scanned += 1;
            if scanned > FD_SCAN_MAX {
                return None;
            }
            if std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == wanted.as_str()) {
                let name = std::fs::read_to_string(process.path().join("comm")).unwrap_or_default();
                return Some((pid, name.trim().to_owned()));
            }
        }
    }
    None
}

/// The files of the Unix-domain socket, removed when dropped (the pooler stopped).
#[derive(Debug)]
pub struct UnixSocketFiles {
    socket: PathBuf,
    lock: PathBuf,
}

impl Drop for UnixSocketFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_file(&self.lock);
    }
}

/// Binds `<folder>/.s.PGSQL.<port>`, refusing when its lock file names a live process.
pub fn bind_unix(folder: &Path, port: u16) -> std::io::Result<(std::os::unix::net::UnixListener, UnixSocketFiles)> {
    let socket = folder.join(format!(".s.PGSQL.{port}"));
    let lock = folder.join(format!(".s.PGSQL.{port}.lock"));
    if let Some(pid) =
        std::fs::read_to_string(&lock).ok().and_then(|text| text.lines().next()?.trim().parse::<i32>().ok())
    {
        // SAFETY: signal 0 only checks that the process exists; nothing is sent.
        if pid > 0 && pid as u32 != std::process::id() && unsafe { libc::kill(pid, 0) } == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!(
                    "{} is already served by another process (pid {pid}, per {})",
                    socket.display(),
                    lock.display()
                ),
            ));
        }
    }
    // A stale socket or lock (a process that was killed) is replaced.
    let _ = std::fs::remove_file(&socket);
    std::fs::write(&lock, format!("{}\n", std::process::id()))?;
    let files = UnixSocketFiles { socket: socket.clone(), lock };
    let listener = std::os::unix::net::UnixListener::bind(&socket)?;
    // Any local user may connect, as to PostgreSQL's own socket; authentication decides the rest.
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    listener.set_nonblocking(true)?;
    Ok((listener, files))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_unix_socket_on_the_folder_is_refused_and_files_go_at_stop() {
        let folder = tempfile::tempdir().expect("tempdir");
        let (_listener, files) = bind_unix(folder.path(), 7001).expect("bind");
        assert!(folder.path().join(".s.PGSQL.7001").exists());
        // Another live process in the lock file: refused.
        std::fs::write(folder.path().join(".s.PGSQL.7001.lock"), "1\n").expect("lock");
        let error = bind_unix(folder.path(), 7001).expect_err("pid 1 holds it");
        assert!(error.to_string().contains("pid 1"), "{error}");
        drop(files);
        assert!(!folder.path().join(".s.PGSQL.7001").exists(), "the socket is removed at stop");
    }

    #[test]
    fn proc_lines_parse_to_addresses() {
        let v4 = "   0: 0100007F:1920 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1";
        assert_eq!(parse_listener(v4), Some(("127.0.0.1:6432".parse().expect("address"), 12345)));
        let established = v4.replace(" 0A ", " 01 ");
        assert_eq!(parse_listener(&established), None);
        let v6 = "   0: 00000000000000000000000001000000:1920 00000000000000000000000000000000:0000 0A \
                  00000000:00000000 00:00000000 00000000     0        0 777 1";
        assert_eq!(parse_listener(v6), Some(("[::1]:6432".parse().expect("address"), 777)));
    }

    #[test]
    fn a_second_listener_on_the_address_is_refused_and_our_own_shards_are_not() {
        // Goal: shards of one pooler share the port; any other listener there is refused.
        let ours = bind_shards("127.0.0.1:0".parse().expect("address"), 2, 16).expect("bind two shards");
        let address = ours[0].local_addr().expect("address");
        let error = bind_shards(address, 1, 16).expect_err("a second pooler must be refused");
        assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse);
        assert!(error.to_string().contains(&address.to_string()), "{error}");
        assert!(error.to_string().contains(&format!("pid {}", std::process::id())), "{error}");
    }
}
